"""build_gpt_model: every supported layout builds, runs forward/backward and has the right shape."""

from __future__ import annotations

import warnings

import pytest
import torch

from hetrl.config.model import ModelConfig
from hetrl.config.trainer import TrainerConfig

MOE = dict(num_experts=4, moe_ffn_hidden_size=64, moe_router_topk=2)


def model_cfg(arch: str, **overrides) -> ModelConfig:
    return ModelConfig(arch=arch, **(MOE if arch == "qwen3_moe" else {}), **overrides)


def expected_num_params(cfg: ModelConfig, vocab: int) -> int:
    """Parameter count of the full model from the architecture table in model.py."""
    h, d, nq, nkv = cfg.hidden_size, cfg.kv_channels, cfg.num_attention_heads, cfg.num_query_groups
    qkv_out = (nq + 2 * nkv) * d
    attn = (
        h * qkv_out
        + nq * d * h
        + (qkv_out if cfg.arch == "qwen2" else 0)
        + (2 * d if cfg.arch in ("qwen3", "qwen3_moe") else 0)
    )
    if cfg.is_moe:
        mlp = h * cfg.num_experts + cfg.num_experts * 3 * h * cfg.moe_ffn_hidden_size
    else:
        mlp = 3 * h * cfg.ffn_hidden_size
    per_layer = attn + mlp + 2 * h  # + input and pre-MLP RMSNorm
    embeddings = vocab * h * (1 if cfg.tie_word_embeddings else 2)
    return cfg.num_layers * per_layer + embeddings + h  # + final norm


def _build_and_step(rank: int, world_size: int, arch: str, overrides: dict) -> dict:
    from megatron.core.transformer.mlp import MLP

    from hetrl.trainer.model import build_gpt_model, padded_vocab_size
    from hetrl.trainer.parallel import destroy_parallel, init_parallel

    mcfg, tcfg = model_cfg(arch, **overrides), TrainerConfig(precision="fp32")
    groups = init_parallel(tcfg)
    try:
        model = build_gpt_model(mcfg, tcfg, pg_collection=groups.pg_collection, seed=7)
        tokens = torch.randint(0, mcfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
        positions = torch.arange(12).expand(2, 12)
        logits = model(tokens, positions, None)
        logits.float().square().mean().backward()
        has_grads = all(p.grad is not None or getattr(p, "main_grad", None) is not None for p in model.parameters())
        return {
            "shape": tuple(logits.shape),
            "num_params": sum(p.numel() for p in model.parameters()),
            "names": [n for n, _ in model.named_parameters()],
            "checksum": float(sum(p.double().sum() for p in model.parameters())),
            "vocab": padded_vocab_size(mcfg, tcfg.tensor_parallel),
            "grads": has_grads,
            "finite": bool(torch.isfinite(logits).all()),
            "activations": {type(m.activation_func).__name__ for m in model.modules() if isinstance(m, MLP)},
        }
    finally:
        destroy_parallel()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "qwen3_moe"])
def test_each_arch_builds_runs_and_has_the_hf_layout(two_ranks, arch: str) -> None:
    results = two_ranks.run(_build_and_step, arch, {})
    first = results[0]
    cfg = model_cfg(arch)
    assert first["shape"] == (2, 12, first["vocab"])
    assert first["finite"] and first["grads"]
    assert first["num_params"] == expected_num_params(cfg, first["vocab"])
    names = " ".join(first["names"])
    assert ("linear_qkv.bias" in names) == (arch == "qwen2")
    assert ("q_layernorm" in names) == (arch in ("qwen3", "qwen3_moe"))
    assert ("mlp.router.weight" in names) == (arch == "qwen3_moe")
    # Dense MLPs on the local spec: hetrl's SwiGLU; an MoE layer's experts keep megatron's activation function.
    assert first["activations"] == ({"function"} if arch == "qwen3_moe" else {"SwiGLU"})
    # Same seed on both data-parallel ranks: the same weights.
    assert results[0]["checksum"] == results[1]["checksum"]


def test_tied_embeddings_drop_the_output_layer(two_ranks) -> None:
    first = two_ranks.run(_build_and_step, "llama", {"tie_word_embeddings": True})[0]
    assert first["num_params"] == expected_num_params(model_cfg("llama", tie_word_embeddings=True), first["vocab"])
    assert not any(n.startswith("output_layer") for n in first["names"])


def test_padded_vocab_is_a_multiple_of_tp() -> None:
    from hetrl.trainer.model import padded_vocab_size

    assert padded_vocab_size(ModelConfig(vocab_size=131), 1) == 131
    assert padded_vocab_size(ModelConfig(vocab_size=131), 4) == 132


def test_bad_layouts_are_user_errors() -> None:
    from hetrl.trainer.parallel import check_layout

    with pytest.raises(ValueError, match="not divisible"):
        check_layout(TrainerConfig(tensor_parallel=2, precision="fp32"), 3, has_gpu=False)
    with pytest.raises(ValueError, match="expert_parallel"):
        check_layout(TrainerConfig(expert_parallel=4, precision="fp32"), 2, has_gpu=False)
    assert check_layout(TrainerConfig(tensor_parallel=2, precision="fp32"), 4, has_gpu=True) == 2


def test_bf16_on_a_cpu_without_native_bf16_is_warned_of(monkeypatch) -> None:
    from hetrl.trainer import parallel

    monkeypatch.setattr(parallel, "cpu_has_native_bf16", lambda: False)
    with pytest.warns(UserWarning, match="without native bf16"):
        parallel.check_layout(TrainerConfig(precision="bf16"), 1, has_gpu=False)
    monkeypatch.setattr(parallel, "cpu_has_native_bf16", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert parallel.check_layout(TrainerConfig(precision="bf16"), 1, has_gpu=False) == 1
        assert parallel.check_layout(TrainerConfig(precision="bf16"), 1, has_gpu=True) == 1
