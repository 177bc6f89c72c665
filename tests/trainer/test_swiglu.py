"""hetrl's SwiGLU module: megatron's unfused gated activation, bit for bit, forward and backward."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hetrl.trainer.swiglu import SwiGLU


def megatron_glu(x: torch.Tensor) -> torch.Tensor:
    """megatron's MLP without bias-activation fusion: ``silu(x1) * (x2 + glu_linear_offset)``, offset 0."""
    gate, up = torch.chunk(x, 2, dim=-1)
    return F.silu(gate) * (up + 0.0)


def test_values_and_gradients_equal_megatrons_unfused_glu() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(7, 3, 2 * 48, generator=generator)  # [sequence, batch, 2 * ffn], as the MLP hands it over
    grad = torch.randn(7, 3, 48, generator=generator)
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = SwiGLU()(ours)
    out.backward(grad)
    megatron_glu(theirs).backward(grad)
    assert torch.equal(out, megatron_glu(x)) and out.shape == (7, 3, 48)
    assert torch.equal(ours.grad, theirs.grad)
    assert SwiGLU().sharded_state_dict() == {}  # nothing for megatron's distributed checkpoint


def test_gradient_of_a_non_contiguous_input_and_output_gradient() -> None:
    """The MLP's input is a transposed view under some layouts; the gradient's halves must still land right."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 16, generator=generator).transpose(0, 1)
    grad = torch.randn(3, 5, 8, generator=generator).transpose(0, 1)
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    SwiGLU()(ours).backward(grad)
    megatron_glu(theirs).backward(grad)
    assert torch.equal(ours.grad, theirs.grad)
