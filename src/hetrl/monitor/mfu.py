"""Model FLOPs utilisation (``perf/mfu``): the trainer's useful FLOPs per second over the devices' peak.

"Model FLOPs" count the arithmetic the model needs, not what the kernels did: padding, activation
recomputation and the log-prob passes before the update do not count, so MFU compares runs and
hardware fairly. Per token, a forward pass multiplies by every weight matrix the token meets once
(2 FLOPs per weight; an MoE token meets only its top-k experts and the router), plus the attention
scores and their weighted sum over the earlier tokens (causal); the backward pass costs twice the
forward, hence the factor 6 (Kaplan et al. 2020; Chowdhery et al. 2022, appendix B, counted causally
here). The embedding lookup is not a matmul and norms are negligible; the output projection counts.

Peaks are the vendors' dense (no sparsity) bf16 tensor-core figures per device. MFU is reported
for bf16 training on a GPU found in :data:`PEAK_BF16_FLOPS` only; anything else gets no metric
(and one log line saying why) rather than a misleading one.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from hetrl.config.model import ModelConfig
from hetrl.monitor import names

log = logging.getLogger(__name__)

#: (pattern on ``torch.cuda.get_device_name()``, dense bf16 peak FLOP/s per device); first match wins,
#: so variants come before the family name (H100 PCIe before H100, GH200 before H200).
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    (r"GH200", 989e12),
    (r"H200 NVL", 835e12),
    (r"H200", 989e12),
    (r"H100 PCIe", 756e12),
    (r"H100 NVL", 835e12),
    (r"H100|H800", 989e12),
    (r"B200", 2250e12),
    (r"A100|A800", 312e12),
    (r"L40S", 362e12),
    (r"\bL4\b", 121e12),
)


def peak_bf16_flops(device_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of one device by its CUDA name, or None for a device not in the table."""
    for pattern, peak in PEAK_BF16_FLOPS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return peak
    return None


def matmul_weights_per_token(cfg: ModelConfig) -> int:
    """Weights one token is multiplied by in a forward pass (MoE: the router and its top-k experts)."""
    h = cfg.hidden_size
    head_dim = cfg.head_dim or h // cfg.num_attention_heads
    q_width, kv_width = cfg.num_attention_heads * head_dim, cfg.num_query_groups * head_dim
    attention = h * q_width + 2 * h * kv_width + q_width * h  # q, k, v, output projections
    if cfg.num_experts is not None:
        mlp = h * cfg.num_experts + cfg.moe_router_topk * 3 * h * cfg.moe_ffn_hidden_size
    else:
        mlp = 3 * h * cfg.ffn_hidden_size  # SwiGLU: gate, up, down
    return cfg.num_layers * (attention + mlp) + cfg.vocab_size * h  # + the output projection


def training_flops(cfg: ModelConfig, seq_lens: Sequence[int]) -> float:
    """Model FLOPs of one forward + backward pass over sequences of these lengths.

    Per sequence of T tokens: 6 N T for the weights, and 6 L d T (T + 1) for causal attention
    (position t attends to t keys: 2 d t FLOPs for the scores and 2 d t for the weighted sum per
    layer, d = heads x head_dim, summed over t and tripled for the backward pass).
    """
    weights = matmul_weights_per_token(cfg)
    head_dim = cfg.head_dim or cfg.hidden_size // cfg.num_attention_heads
    d_attn = cfg.num_attention_heads * head_dim
    return float(sum(6 * weights * t + 6 * cfg.num_layers * d_attn * t * (t + 1) for t in seq_lens))


class MfuMeter:
    """Turns a train step's sequence lengths and wall time into ``perf/mfu`` (or nothing; see module doc)."""

    def __init__(self, cfg: ModelConfig, num_devices: int, device_name: str | None, precision: str) -> None:
        self.cfg, self.num_devices = cfg, num_devices
        self.peak = None if device_name is None else peak_bf16_flops(device_name)
        if device_name is not None and self.peak is None:
            log.info(
                "perf/mfu not reported: no bf16 peak known for GPU %r (add it to hetrl.monitor.mfu.PEAK_BF16_FLOPS)",
                device_name,
            )
        elif self.peak is not None and precision != "bf16":
            log.info("perf/mfu not reported: it compares against the bf16 peak, the trainer runs %s", precision)
            self.peak = None

    @classmethod
    def for_this_process(cls, cfg: ModelConfig, num_devices: int, precision: str) -> MfuMeter:
        """A meter for the local device: silent and inactive on CPU."""
        import torch

        name = torch.cuda.get_device_name() if torch.cuda.is_available() else None
        return cls(cfg, num_devices, name, precision)

    def measure(self, seq_lens: Sequence[int], seconds: float) -> dict[str, float]:
        """``{perf/mfu: ...}`` for a step that trained these sequences in ``seconds`` over all devices."""
        if self.peak is None or seconds <= 0:
            return {}
        return {names.PERF_MFU: training_flops(self.cfg, seq_lens) / (seconds * self.peak * self.num_devices)}
