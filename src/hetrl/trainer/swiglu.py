"""SwiGLU as one autograd node, the gated MLP's activation in megatron's local layer spec.

megatron's unfused gated MLP computes ``silu(x1) * x2`` from a ``torch.chunk`` of the first linear
layer's output ``x = [x1 | x2]``; autograd then builds ``x``'s gradient by concatenating the two
halves' gradients into a new ``[tokens, 2 * ffn]`` tensor (and first adds its ``glu_linear_offset``,
0.0, in a pass of its own). :class:`SwiGLU` computes the same values and writes both halves of the
gradient straight into one tensor (aten's own ``silu_backward`` for the gate half, so the gradient is
bit for bit the unfused one's): 33 -> 24-27 ms a layer at 3,700 tokens of the ~44M model of
``bench/vs_trl.py``, ~0.1 s of its 6.9 s CPU training step.

megatron plugs it in through the MLP's activation module (``MLPSubmodules.activation_func`` with
``TransformerConfig.use_te_activation_func``: its hook for an activation that takes ``[x1 | x2]``
whole, made for transformer-engine's and used here without it); :mod:`hetrl.trainer.model` does so
for dense models on the local spec.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


class _SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        activated = F.silu(gate)
        ctx.save_for_backward(x, activated)
        return activated * up

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        x, activated = ctx.saved_tensors
        gate, up = x.chunk(2, dim=-1)
        grad_x = torch.empty_like(x)
        grad_gate, grad_up = grad_x.chunk(2, dim=-1)
        torch.mul(grad, activated, out=grad_up)
        torch.ops.aten.silu_backward.grad_input(grad * up, gate, grad_input=grad_gate)
        return grad_x


class SwiGLU(torch.nn.Module):
    """``silu(x1) * x2`` of ``x = [x1 | x2]`` (last dimension), as megatron's ``MLP`` builds its activation module."""

    def __init__(self, config: Any = None) -> None:  # megatron's build_module passes the TransformerConfig
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SwiGLUFunction.apply(x)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> dict:
        """Nothing to save (megatron's distributed checkpoint asks every MLP child)."""
        return {}
