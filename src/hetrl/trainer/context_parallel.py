"""Context parallelism (CP): each of ``cp`` ranks holds a slice of every sequence.

Why: RL responses of tens of thousands of tokens do not fit one device's activations; CP splits
the sequence dimension of every micro-batch over the ranks of the context-parallel group.

Layout (megatron's, so its rotary embedding slices itself to match): a row of ``T`` tokens
(``T`` a multiple of ``2 * cp``) is cut into ``2 * cp`` chunks, and CP rank ``r`` holds chunks ``r``
and ``2 * cp - 1 - r``. Under a causal mask early chunks are cheap and late ones dear; pairing
them gives every rank the same attention work (:func:`local_positions`).

What crosses ranks, and why the gradients add up:

* **attention** — :class:`AllGatherAttention` (the local layer spec's core attention) all-gathers
  keys and values over the CP group and attends this rank's queries to the whole sequence, with
  the causal (or packed block-causal) mask taken at the queries' global positions. Its backward
  sums the key/value gradients of every rank's queries (:func:`gather_sequence` with
  ``sum_grads=True``). This is the all-gather form of CP (as in Llama 3 training): simple and exact,
  at the cost of holding the full K/V per rank. transformer-engine's attention brings its own
  ring-exchange CP on GPUs.
* **log-probs** — per-position log-probs of the local slice are all-gathered back into full rows
  (``sum_grads=False``), so the loss, including sequence-level terms (GSPO, seq-mean), sees whole
  sequences and is the *same value on every CP rank*. Each rank's backward then only needs the
  gradient of its own slice, which it already has: the gather's backward is a slice, no traffic.
  Summed over CP ranks those partial gradients are the full gradient; megatron's schedule
  multiplies the loss by ``cp`` and its DDP averages over the data x context group, which
  cancels.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from hetrl.trainer.batch import MicroBatch


def local_positions(length: int, cp_size: int, cp_rank: int) -> Tensor:
    """Positions ``[length / cp]`` (of a row of ``length``) that CP rank ``cp_rank`` holds, in order."""
    if length % (2 * cp_size):
        raise ValueError(f"a context-parallel row must be a multiple of 2 x cp = {2 * cp_size} tokens, got {length}")
    chunk = length // (2 * cp_size)
    first, second = cp_rank * chunk, (2 * cp_size - 1 - cp_rank) * chunk
    return torch.cat([torch.arange(first, first + chunk), torch.arange(second, second + chunk)])


def shard_micro_batch(mb: MicroBatch, cp_size: int, cp_rank: int) -> MicroBatch:
    """This rank's slice of a micro-batch's model-space inputs (sample-space fields stay whole).

    The labels, positions and tokens keep their columns at :func:`local_positions`; a packed
    block-causal mask keeps the rows of the local queries and every key column.
    """
    if cp_size == 1:
        return mb
    keep = local_positions(mb.tokens.shape[1], cp_size, cp_rank)
    mask = None if mb.attention_mask is None else mb.attention_mask[:, :, keep, :]
    return MicroBatch(
        tokens=mb.tokens[:, keep], position_ids=mb.position_ids[:, keep], labels=mb.labels[:, keep],
        attention_mask=mask, gather_index=mb.gather_index, loss_mask=mb.loss_mask,
        rollout_logprobs=mb.rollout_logprobs, advantages=mb.advantages,
        sample_indices=mb.sample_indices, num_tokens=mb.num_tokens,
    )


class _GatherSequence(torch.autograd.Function):
    """All-gather of CP slices along ``dim`` into full, position-ordered sequences."""

    @staticmethod
    def forward(ctx: Any, local: Tensor, group: dist.ProcessGroup, dim: int, sum_grads: bool) -> Tensor:
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        length = local.shape[dim] * size
        ctx.group, ctx.dim, ctx.sum_grads = group, dim, sum_grads
        ctx.keep = local_positions(length, size, rank).to(local.device)
        parts = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(parts, local.contiguous(), group=group)
        order = torch.cat([local_positions(length, size, r) for r in range(size)]).to(local.device)
        full = torch.empty_like(torch.cat(parts, dim=dim))
        full.index_copy_(dim, order, torch.cat(parts, dim=dim))
        return full

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        if ctx.sum_grads:
            grad = grad.contiguous()
            dist.all_reduce(grad, group=ctx.group)  # gloo has no reduce-scatter; the slice below is its result
        return grad.index_select(ctx.dim, ctx.keep), None, None, None


def gather_sequence(local: Tensor, group: dist.ProcessGroup, *, dim: int, sum_grads: bool) -> Tensor:
    """The full sequences from every CP rank's slice (see the module docstring for ``sum_grads``).

    ``sum_grads=True``: other ranks' results depend on this slice (keys/values), so its gradient
    is the sum of every rank's. ``sum_grads=False``: every rank computes the same function of the
    gathered tensor, so each keeps the gradient of its own slice.
    """
    return _GatherSequence.apply(local, group, dim, sum_grads)


class AllGatherAttention(torch.nn.Module):
    """Softmax attention for megatron's local layer spec, with context parallelism.

    A drop-in for megatron's ``DotProductAttention`` (same constructor and ``forward``), built on
    ``torch.nn.functional.scaled_dot_product_attention``: with ``cp == 1`` it is plain causal (or
    masked) attention, with ``cp > 1`` it gathers keys/values over the CP group first. Inputs are
    megatron's ``[s, b, heads, head_dim]``; the output is ``[s, b, heads * head_dim]``.
    ``attention_mask`` (packed rows) is ``[b, 1, s_local, s_full]`` bool, True = masked.
    """

    def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection: Any = None) -> None:
        super().__init__()
        dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        if dropout:
            raise ValueError("hetrl trains without attention dropout (trainer and engine log-probs must agree)")
        if config.apply_query_key_layer_scaling or config.softmax_type != "vanilla" or config.window_size is not None:
            raise ValueError("AllGatherAttention supports vanilla softmax attention without layer scaling or windows")
        self.config = config
        self.cp_group = None if pg_collection is None or pg_collection.cp.size() == 1 else pg_collection.cp
        self.softmax_scale = softmax_scale or 1.0 / math.sqrt(config.kv_channels)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                attn_mask_type: Any = None, attention_bias: Tensor | None = None, packed_seq_params: Any = None) -> Tensor:
        if attention_bias is not None or packed_seq_params is not None:
            raise ValueError("AllGatherAttention takes neither attention_bias nor packed_seq_params (packed rows use a mask)")
        allowed = None if attention_mask is None else ~attention_mask
        if self.cp_group is not None:
            key = gather_sequence(key, self.cp_group, dim=0, sum_grads=True)
            value = gather_sequence(value, self.cp_group, dim=0, sum_grads=True)
            if allowed is None:
                size, rank = dist.get_world_size(self.cp_group), dist.get_rank(self.cp_group)
                q_pos = local_positions(key.shape[0], size, rank).to(query.device)
                allowed = torch.arange(key.shape[0], device=query.device)[None, :] <= q_pos[:, None]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
        if k.shape[1] != q.shape[1]:  # grouped-query attention: each KV head serves heads/groups queries
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=allowed is None, scale=self.softmax_scale)
        return out.permute(2, 0, 1, 3).reshape(query.shape[0], query.shape[1], -1)
