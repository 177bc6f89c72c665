"""Context parallelism (CP): each of ``cp`` ranks holds a slice of every sequence.

Why: RL responses of tens of thousands of tokens do not fit one device's activations; CP splits
the sequence dimension of every micro-batch over the ranks of the context-parallel group.

Layout (megatron's and transformer-engine's, so megatron's rotary embedding slices itself to
match): every attention span (a row, or each sample of a packed THD row, its length padded to a
multiple of ``2 * cp``) is cut into ``2 * cp`` chunks, and CP rank ``r`` holds chunks ``r`` and
``2 * cp - 1 - r`` of each. Under a causal mask early chunks are cheap and late ones dear; pairing
them gives every rank the same attention work (:func:`local_positions`).

What crosses ranks, and why the gradients add up:

* **attention** — :class:`AllGatherAttention` (the local layer spec's core attention) all-gathers
  keys and values over the CP group and attends this rank's queries to the whole span, with the
  causal mask taken at the queries' global positions. Its backward
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

import functools
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from hetrl.trainer import shared_prompts
from hetrl.trainer.batch import MicroBatch, spans_from_bounds


def local_positions(spans: Sequence[tuple[int, int]], cp_size: int, cp_rank: int) -> Tensor:
    """Row positions CP rank ``cp_rank`` holds, in order: chunks ``r`` and ``2cp-1-r`` of every span.

    ``spans`` are ``(start, length)`` of the attention spans of a row: the whole row, or each
    packed sample (``MicroBatch.spans``); every length must be a multiple of ``2 * cp``. Every
    layer asks for the same few layouts, so they are built once (the result must not be modified).
    """
    return _local_positions(tuple(spans), cp_size, cp_rank)


@functools.lru_cache(maxsize=256)
def _local_positions(spans: tuple[tuple[int, int], ...], cp_size: int, cp_rank: int) -> Tensor:
    held = []
    for start, length in spans:
        if length % (2 * cp_size):
            raise ValueError(
                f"a context-parallel span must be a multiple of 2 x cp = {2 * cp_size} tokens, got {length}"
            )
        chunk = length // (2 * cp_size)
        for index in (cp_rank, 2 * cp_size - 1 - cp_rank):
            held.append(torch.arange(start + index * chunk, start + (index + 1) * chunk))
    return torch.cat(held) if held else torch.zeros(0, dtype=torch.long)


def shard_micro_batch(mb: MicroBatch, cp_size: int, cp_rank: int) -> MicroBatch:
    """This rank's slice of a micro-batch's model-space inputs (sample-space fields stay whole).

    Tokens, positions and labels keep their columns at :func:`local_positions`; the packed layout
    (``cu_seqlens``) stays that of the whole row, which is what attention and RoPE are told.
    """
    if cp_size == 1:
        return mb
    keep = local_positions(mb.spans, cp_size, cp_rank)
    routed = None if mb.routed_experts is None else mb.routed_experts[:, keep]
    return replace(
        mb,
        tokens=mb.tokens[:, keep],
        position_ids=mb.position_ids[:, keep],
        labels=mb.labels[:, keep],
        routed_experts=routed,
    )


class _GatherSequence(torch.autograd.Function):
    """All-gather of CP slices along ``dim`` into full, position-ordered sequences."""

    @staticmethod
    def forward(
        ctx: Any,
        local: Tensor,
        group: dist.ProcessGroup,
        dim: int,
        sum_grads: bool,
        spans: Sequence[tuple[int, int]] | None,
    ) -> Tensor:
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        spans = spans or [(0, local.shape[dim] * size)]
        ctx.group, ctx.dim, ctx.sum_grads = group, dim, sum_grads
        ctx.keep = local_positions(spans, size, rank).to(local.device)
        parts = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(parts, local.contiguous(), group=group)
        order = torch.cat([local_positions(spans, size, r) for r in range(size)]).to(local.device)
        gathered = torch.cat(parts, dim=dim)  # rank-major; `order` puts each position where it belongs
        return torch.empty_like(gathered).index_copy_(dim, order, gathered)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        if ctx.sum_grads:
            grad = grad.clone(memory_format=torch.contiguous_format)  # autograd's buffer is not ours to overwrite
            dist.all_reduce(grad, group=ctx.group)  # gloo has no reduce-scatter; the slice below is its result
        return grad.index_select(ctx.dim, ctx.keep), None, None, None, None


def gather_sequence(
    local: Tensor,
    group: dist.ProcessGroup,
    *,
    dim: int,
    sum_grads: bool,
    spans: Sequence[tuple[int, int]] | None = None,
) -> Tensor:
    """The full rows from every CP rank's slice (see the module docstring for ``sum_grads``).

    ``spans`` give the row's attention spans (packed samples); default: the row is one span.

    ``sum_grads=True``: other ranks' results depend on this slice (keys/values), so its gradient
    is the sum of every rank's. ``sum_grads=False``: every rank computes the same function of the
    gathered tensor, so each keeps the gradient of its own slice.
    """
    return _GatherSequence.apply(local, group, dim, sum_grads, spans)


class AllGatherAttention(torch.nn.Module):
    """Softmax attention for megatron's local layer spec, with context parallelism and packing.

    A drop-in for megatron's ``DotProductAttention`` (same constructor and ``forward``), built on
    ``torch.nn.functional.scaled_dot_product_attention``. Inputs are megatron's
    ``[s, b, heads, head_dim]``, or ``[t, heads, head_dim]`` for a packed row (THD
    ``packed_seq_params``: attention stays inside each sample's span); the output is
    ``[s, b, heads * head_dim]`` (``[t, heads * head_dim]``). With ``cp > 1`` keys and values are
    gathered over the CP group first, and each query sees the keys at or before its position.
    Shared-prompt rows (:mod:`hetrl.trainer.shared_prompts`) come with their tree ids ``[2, b, s]`` (tree,
    branch) in megatron's ``attention_mask`` argument (hetrl's model forward passes them, megatron hands them down
    untouched); their attention is :func:`~hetrl.trainer.shared_prompts.tree_attention`, on unpacked rows
    without CP.
    """

    def __init__(
        self,
        config: Any,
        layer_number: int,
        attn_mask_type: Any,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
    ) -> None:
        super().__init__()
        dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        if dropout:
            raise ValueError("hetrl trains without attention dropout (trainer and engine log-probs must agree)")
        if config.apply_query_key_layer_scaling or config.softmax_type != "vanilla" or config.window_size is not None:
            raise ValueError("AllGatherAttention supports vanilla softmax attention without layer scaling or windows")
        if attn_mask_type.name != "causal":
            raise ValueError(f"AllGatherAttention is causal self-attention; got attn_mask_type={attn_mask_type.name}")
        if config.context_parallel_size > 1 and pg_collection is None:
            raise ValueError("context parallelism needs the process groups: pass pg_collection")
        self.config = config
        self.cp_group = None if config.context_parallel_size == 1 else pg_collection.cp
        self.softmax_scale = softmax_scale or 1.0 / math.sqrt(config.kv_channels)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> Tensor:
        if attention_bias is not None:
            raise ValueError("AllGatherAttention takes no attention bias")
        if attention_mask is not None:
            if packed_seq_params is not None or self.cp_group is not None:
                raise ValueError(
                    "shared-prompt rows (tree ids in attention_mask) run without packing or context parallelism"
                )
            return shared_prompts.tree_attention(query, key, value, attention_mask, self.softmax_scale)
        if packed_seq_params is None:  # [s, b, h, d]: one span per row, the batch folded into sdpa's batch dim
            out = self._attend(query.permute(1, 2, 0, 3), key.permute(1, 2, 0, 3), value.permute(1, 2, 0, 3), dim=2)
            return out.permute(2, 0, 1, 3).reshape(query.shape[0], query.shape[1], -1)
        bounds = packed_seq_params.cu_seqlens_q_padded
        spans = spans_from_bounds(packed_seq_params.cu_seqlens_q if bounds is None else bounds)
        q, k, v = (t.transpose(0, 1) for t in (query, key, value))  # [h, t, d]
        return self._attend(q, k, v, dim=1, spans=spans).transpose(0, 1).reshape(query.shape[0], -1)

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, *, dim: int, spans: list[tuple[int, int]] | None = None
    ) -> Tensor:
        """Causal attention of this rank's queries along ``dim``, span by span (``[..., s, d]`` layouts)."""
        if self.cp_group is not None:
            k = gather_sequence(k, self.cp_group, dim=dim, sum_grads=True, spans=spans)
            v = gather_sequence(v, self.cp_group, dim=dim, sum_grads=True, spans=spans)
        if k.shape[dim - 1] != q.shape[dim - 1]:  # grouped-query attention: each KV head serves heads/groups queries
            k = k.repeat_interleave(q.shape[dim - 1] // k.shape[dim - 1], dim=dim - 1)
            v = v.repeat_interleave(q.shape[dim - 1] // v.shape[dim - 1], dim=dim - 1)
        spans = spans or [(0, k.shape[dim])]
        cp_size, cp_rank = (
            (1, 0) if self.cp_group is None else (dist.get_world_size(self.cp_group), dist.get_rank(self.cp_group))
        )
        outputs, offset = [], 0
        for start, length in spans:
            rows = length // cp_size  # this rank's queries of the span
            q_span = q.narrow(dim, offset, rows)
            k_span, v_span = k.narrow(dim, start, length), v.narrow(dim, start, length)
            offset += rows
            if cp_size == 1:
                outputs.append(
                    F.scaled_dot_product_attention(q_span, k_span, v_span, is_causal=True, scale=self.softmax_scale)
                )
                continue
            q_pos = local_positions([(0, length)], cp_size, cp_rank).to(q.device)
            allowed = torch.arange(length, device=q.device)[None, :] <= q_pos[:, None]
            outputs.append(
                F.scaled_dot_product_attention(q_span, k_span, v_span, attn_mask=allowed, scale=self.softmax_scale)
            )
        return torch.cat(outputs, dim=dim) if len(outputs) > 1 else outputs[0]
