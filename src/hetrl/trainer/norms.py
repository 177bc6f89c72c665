"""hetrl's layer norms for megatron's local layer spec: torch's norms, with sequence parallelism allowed.

The language model's blocks (``hetrl.trainer.model``) and the vision tower's (``hetrl.trainer.vision``)
both build them.
"""

from __future__ import annotations

import torch


class TorchNorm:
    """megatron's ``WrappedTorchNorm`` (torch's ``RMSNorm``/``LayerNorm``), with sequence parallelism allowed.

    The local spec's norm (no apex, no transformer-engine) asserts ``not config.sequence_parallel``,
    though a norm is per token and computes the same on a sequence shard. What sequence parallelism
    does need is the gradient of the norm's weight: each TP rank sees only its share of the tokens,
    so its gradient is a partial sum. Like apex's ``FusedLayerNorm`` and transformer-engine's norms,
    this one tags its parameters ``sequence_parallel``, which is what megatron's
    ``finalize_model_grads`` all-reduces over TP (``_allreduce_non_tensor_model_parallel_grads``).
    Its weights are in ``params_dtype``, as transformer-engine's are: with bf16 megatron's optimizer
    keeps fp32 master copies of bf16 parameters only, and the checkpoint maps no other.
    """

    tags_sequence_parallel = True

    def __new__(
        cls,
        config,
        hidden_size: int,
        eps: float = 1e-5,
        persist_layer_norm: bool = False,  # noqa: ANN001 - megatron's config
        zero_centered_gamma: bool = False,
        normalization: str = "LayerNorm",
    ) -> torch.nn.Module:
        if config.layernorm_zero_centered_gamma or config.memory_efficient_layer_norm:
            raise ValueError("hetrl's local norm has no zero-centred gamma or memory-efficient mode")
        norms = {"RMSNorm": torch.nn.RMSNorm, "LayerNorm": torch.nn.LayerNorm}
        if config.normalization not in norms:
            raise ValueError(f"hetrl's local norm builds {sorted(norms)}, not {config.normalization!r}")
        norm = norms[config.normalization](normalized_shape=hidden_size, eps=eps, dtype=config.params_dtype)
        for param in norm.parameters():
            param.sequence_parallel = cls.tags_sequence_parallel and config.sequence_parallel
        return norm


class HeadNorm(TorchNorm):
    """:class:`TorchNorm` on each query/key head (qk-norm). It runs after the QKV projection has gathered
    the sequence, on every token and this rank's heads, so it is not sequence parallel: megatron
    all-reduces its gradient over TP by name (``q_layernorm``/``k_layernorm``), with or without SP."""

    tags_sequence_parallel = False
