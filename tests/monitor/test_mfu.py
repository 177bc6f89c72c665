"""perf/mfu: the FLOPs formula against hand counts (dense and MoE), the GPU table, CPU silence."""

from __future__ import annotations

import logging

import pytest

from hetrl.config.model import ModelConfig
from hetrl.monitor import names
from hetrl.monitor.mfu import MfuMeter, matmul_weights_per_token, peak_bf16_flops, training_flops

# hidden 8, 2 query heads of width 4, 1 KV group, 1 layer, vocabulary 10.
SHAPE = dict(vocab_size=10, hidden_size=8, num_layers=1, num_attention_heads=2, num_query_groups=1, ffn_hidden_size=16)
DENSE = ModelConfig(**SHAPE)
MOE = ModelConfig(arch="qwen3_moe", **SHAPE, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=8)
# Hand counts: q 8x8 + k 8x4 + v 8x4 + o 8x8 = 192; output projection 10x8 = 80.
DENSE_WEIGHTS = 192 + 3 * 8 * 16 + 80  # SwiGLU 3 x 8 x 16 = 384 -> 656
MOE_WEIGHTS = 192 + (8 * 4 + 2 * 3 * 8 * 8) + 80  # router 8x4, two of the four 3 x 8 x 8 experts -> 688


def test_weights_per_token_by_hand():
    assert matmul_weights_per_token(DENSE) == DENSE_WEIGHTS == 656
    assert matmul_weights_per_token(MOE) == MOE_WEIGHTS == 688


def test_training_flops_by_hand():
    # A sequence of 3 tokens: 6 N T for the weights; causal attention over width 8: positions attend to
    # 1, 2, 3 keys, 4 FLOPs per key and width unit (scores + weighted sum), x3 for fwd+bwd: 12 * 8 * 6.
    assert training_flops(DENSE, [3]) == 6 * 656 * 3 + 12 * 8 * (1 + 2 + 3)
    assert training_flops(MOE, [3, 1]) == 6 * 688 * 4 + 12 * 8 * (1 + 2 + 3) + 12 * 8 * 1


@pytest.mark.parametrize(
    ("device", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA GH200 480GB", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100-PCIE-40GB", 312e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA B200", 2250e12),
    ],
)
def test_known_gpus(device, peak):
    assert peak_bf16_flops(device) == peak


@pytest.mark.parametrize("device", ["NVIDIA GeForce GTX 1080", "Tesla V100-SXM2-16GB", "NVIDIA L40"])
def test_unknown_gpus(device):
    assert peak_bf16_flops(device) is None


def test_meter_on_a_known_gpu():
    meter = MfuMeter(DENSE, num_devices=2, device_name="NVIDIA H100 80GB HBM3", precision="bf16")
    flops = training_flops(DENSE, [3, 5])
    assert meter.measure([3, 5], seconds=0.5) == {names.PERF_MFU: pytest.approx(flops / (0.5 * 989e12 * 2))}


def test_meter_silent_on_cpu_unknown_gpu_and_fp32(caplog):
    with caplog.at_level(logging.INFO, logger="hetrl.monitor.mfu"):
        assert MfuMeter(DENSE, 1, None, "bf16").measure([3], 1.0) == {}
        assert caplog.records == []  # a CPU run has nothing to say about MFU
        assert MfuMeter(DENSE, 1, "NVIDIA GeForce GTX 1080", "bf16").measure([3], 1.0) == {}
        assert MfuMeter(DENSE, 1, "NVIDIA H200", "fp32").measure([3], 1.0) == {}
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and "GTX 1080" in messages[0] and "fp32" in messages[1]


def test_meter_for_this_process_is_inactive_here():
    import torch

    meter = MfuMeter.for_this_process(DENSE, 1, "bf16")
    if torch.cuda.is_available():
        assert meter.peak == peak_bf16_flops(torch.cuda.get_device_name())
    else:
        assert meter.measure([3], 1.0) == {}
