"""Shared-prompt training (``trainer.shared_prompts``): a prompt is computed once for all its completions.

A GRPO group is G completions of one prompt. Laid out one sample per row, the trainer runs the
prompt G times; in the embedded default the prompt is two thirds of every row. Here a group is a
*tree*: its prompt once and then each of its completions as a *branch*::

    prompt[:-1] | prompt[-1] c1 ... | prompt[-1] c2 ... | ...      (branch ids 0 | 1 ... | 2 ... | ...)

and a micro-batch's trees follow each other in one row (tree ids 0, 1, ...), with no padding between.

Each branch starts with the prompt's last token, so that every position still predicts exactly one
next token (the one after it in the row) and the sample-space gather of ``hetrl.trainer.batch`` is
unchanged: completion token ``j`` of a branch starting at row offset ``o`` is read at ``o + j``.
A branch attends to the shared prompt and to itself (:func:`tree_attention`), and its positions
continue from the prompt's (``P - 1, P, ...``), which the model's rotary embedding follows
(:func:`rotary_follows_positions`): every completion token sees exactly the keys, positions and
values it sees in a row of its own, so log-probs and gradients are those of one row per sample, up
to rounding. The configuration checks refuse the layouts this cannot serve (context and sequence
parallelism, packing, images, routing replay, transformer-engine's attention).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from hetrl.records import Sample

PAD_BRANCH = -1  # the tree and branch id of padding, which no real position attends to


def prompt_groups(samples: Sequence[Sample]) -> list[list[int]]:
    """Indices of the samples of each row: one GRPO group's samples with one prompt, in first-seen order.

    By group, not by prompt alone: a task drawn twice in a step would otherwise make a row of twice
    the branches, and every other row of its micro-batch would be padded to it (measured: 1.8x the
    positions of a tiny_grpo step).
    """
    groups: dict[tuple[str, tuple[int, ...]], list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault((s.group_id, tuple(s.prompt_ids)), []).append(i)
    return list(groups.values())


def tree_length(samples: Sequence[Sample]) -> int:
    """Positions of one row holding ``samples`` (one prompt) as branches: the prompt but its last token, then
    each completion behind its own copy of that token."""
    return len(samples[0].prompt_ids) - 1 + sum(1 + len(s.completion_ids) for s in samples)


def tree_attention(query: Tensor, key: Tensor, value: Tensor, tree_ids: Tensor, scale: float) -> Tensor:
    """Softmax attention over shared-prompt rows, ``[T, R, heads, d]`` (megatron's layout) in, ``[T, R, heads * d]``
    out.

    ``tree_ids`` ``[2, R, T]`` are each position's tree (a GRPO group: its prompt and completions) and branch
    in it (0 the prompt, ``k`` the k-th completion); query ``q`` sees key ``k <= q`` of its own tree when ``k``
    is in the prompt or in ``q``'s own branch. Computed without the rows' ``T x T`` scores: a tree's prompt
    attends causally to itself, and each branch, laid out as a sequence of its own, to its prompt's keys
    and causally to its own. A group of G branches of length B behind a prompt of P tokens then scores
    ``P^2 / 2 + G B (P + B)`` query-key pairs; a dense mask over a row of one tree would score
    ``(P + G B)^2`` (about 4x more on the ~44M model of bench/vs_trl.py: P ~35, G = 8, B ~23), and over
    a row of all the micro-batch's trees far more. Keys and values may have fewer heads (GQA).
    Padding positions (``PAD_BRANCH``) get zeros: nothing reads them, and no real position attends to them.
    """
    layout = _TreeLayout(tree_ids.to(query.device))
    trees, groups, p_len, b_len = layout.trees, layout.groups, layout.prompt_len, layout.branch_len
    heads, dim = query.shape[2], query.shape[3]

    def gather(t: Tensor, index: Tensor, shape: tuple[int, ...]) -> Tensor:
        """``t`` ``[T, R, h, d]`` at the layout's positions ``index``, as ``[*shape, h, d]`` -> ``[..., h, n, d]``."""
        t = t.flatten(0, 1).index_select(0, index)
        return t.view(*shape, t.shape[1], dim).transpose(-3, -2)

    q_p, k_p, v_p = (gather(t, layout.prompt_index, (trees, p_len)) for t in (query, key, value))  # [N, h, P, d]
    prompt_out = _attention(q_p, k_p, v_p, layout.prompt_masked, scale)
    q_b, k_b, v_b = (
        gather(t, layout.branch_index, (trees, groups, b_len)) for t in (query, key, value)
    )  # [N, G, h, B, d]
    k_b, v_b = (
        torch.cat([shared[:, None].expand(-1, groups, -1, -1, -1), own], dim=3).flatten(0, 1)
        for shared, own in ((k_p, k_b), (v_p, v_b))
    )  # [N G, kv_h, P + B, d]
    branch_out = _attention(q_b.flatten(0, 1), k_b, v_b, layout.branch_masked, scale)  # [N G, h, B, d]
    flat = [
        prompt_out.transpose(1, 2).flatten(0, 1),
        branch_out.transpose(1, 2).flatten(0, 1),
        prompt_out.new_zeros(1, heads, dim),
    ]
    out = torch.cat(flat).index_select(0, layout.source)  # back to [T * R, h, d]
    return out.view(query.shape[0], query.shape[1], -1)


# Score blocks of up to this many elements are plain matmuls with an fp32 softmax: on CPU they beat torch's
# flash kernel on the short blocks of a tree (its backward under a mask is slow: 22 against 49 ms a layer of
# the ~44M model in bf16). Larger blocks go to scaled_dot_product_attention, which never holds them whole.
_MATMUL_SCORES_MAX = 1 << 26


def _attention(q: Tensor, k: Tensor, v: Tensor, masked: Tensor, scale: float) -> Tensor:
    """``softmax(q k^T scale) v`` where ``masked`` (True: not seen; ``[n or 1, 1, L, S]``) allows.

    ``q`` ``[n, h, L, d]``, ``k`` and ``v`` ``[n, kv_h, S, d]``: with grouped-query heads the query heads of
    one KV head form one longer query sequence, so K and V are never copied per head.
    """
    n, heads, length, dim = q.shape
    kv_heads = k.shape[1]
    if n * heads * length * k.shape[2] > _MATMUL_SCORES_MAX:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=~masked, scale=scale, enable_gqa=kv_heads != heads)
    rep = heads // kv_heads
    accumulate = torch.promote_types(q.dtype, torch.float32)
    q = q.reshape(n, kv_heads, rep * length, dim).to(accumulate)
    scores = torch.matmul(q, k.to(accumulate).transpose(-1, -2)) * scale  # [n, kv_h, rep L, S]
    scores = scores.unflatten(2, (rep, length)).masked_fill(masked[:, :, None], float("-inf")).flatten(2, 3)
    return (scores.softmax(-1).to(v.dtype) @ v).view(n, heads, length, dim)


class _TreeLayout:
    """Where :func:`tree_attention` reads and writes each position of ``[T, R]`` shared-prompt rows.

    ``prompt_index`` ``[N * P]`` and ``branch_index`` ``[N * G * B]`` are the flat ``t * R + r`` positions of
    each of the N trees' prompt (padded to the longest, P) and of every branch (G a tree, padded to the
    longest, B) slot; empty slots read position 0, and nothing real attends to them: a prompt's own
    attention is causal (``prompt_masked``; its padding follows it), and a branch sees its own tree's
    prompt keys only and its own keys causally (``branch_masked`` is what it does not see). ``source``
    maps each position back into the concatenated outputs (prompts, branches, one zero row for padding).
    """

    def __init__(self, tree_ids: Tensor) -> None:
        tree, branch = tree_ids  # [R, T] each
        rows, length = tree.shape
        device = tree.device
        r = torch.arange(rows, device=device)[:, None].expand(rows, length)
        t = torch.arange(length, device=device)[None, :].expand(rows, length)
        real = tree >= 0
        in_prompt, in_branch = real & (branch == 0), real & (branch > 0)
        per_row = int(tree.max()) + 1 if real.any() else 1
        self.trees = rows * per_row
        self.groups = max(int(branch.max()), 1)
        key = (r * per_row + tree).clamp(min=0)  # the tree a position belongs to, numbered over all rows
        slot = (key * self.groups + branch - 1).clamp(min=0)  # the (tree, branch) of a branch position

        def first(index: Tensor, where: Tensor, size: int) -> Tensor:
            """The first position ``t`` of each ``index`` among the positions ``where``."""
            return torch.full((size,), length, device=device).scatter_reduce(0, index[where], t[where], "amin")

        prompt_offset = t - first(key, real, self.trees)[key]  # a tree starts with its prompt
        branch_offset = t - first(slot, in_branch, self.trees * self.groups)[slot]
        prompt_lens = torch.zeros(self.trees, dtype=torch.long, device=device).index_add_(
            0, key[in_prompt], torch.ones_like(key[in_prompt])
        )
        self.prompt_len = max(int(prompt_lens.max()), 1)
        self.branch_len = int(branch_offset[in_branch].max()) + 1 if in_branch.any() else 1
        flat = t * rows + r
        prompt_slot = key * self.prompt_len + prompt_offset
        branch_slot = slot * self.branch_len + branch_offset
        self.prompt_index = torch.zeros(self.trees * self.prompt_len, dtype=torch.long, device=device)
        self.prompt_index[prompt_slot[in_prompt]] = flat[in_prompt]
        self.branch_index = torch.zeros(self.trees * self.groups * self.branch_len, dtype=torch.long, device=device)
        self.branch_index[branch_slot[in_branch]] = flat[in_branch]
        padding = self.trees * self.prompt_len + self.trees * self.groups * self.branch_len  # the zero row
        source = torch.full((length, rows), padding, dtype=torch.long, device=device)
        source[in_prompt.t()] = prompt_slot.t()[in_prompt.t()]
        source[in_branch.t()] = (self.trees * self.prompt_len + branch_slot).t()[in_branch.t()]
        self.source = source.flatten()
        sees_prompt = torch.arange(self.prompt_len, device=device)[None, :] < prompt_lens[:, None]  # [N, P]
        causal = torch.ones(self.branch_len, self.branch_len, dtype=torch.bool, device=device).tril()
        allowed = torch.cat(
            [sees_prompt[:, None, :].expand(-1, self.branch_len, -1), causal.expand(self.trees, -1, -1)], dim=2
        )
        self.branch_masked = ~allowed[:, None, None].expand(-1, self.groups, -1, -1, -1).flatten(
            0, 1
        )  # [N G, 1, B, P + B]
        self.prompt_masked = ~torch.ones(self.prompt_len, self.prompt_len, dtype=torch.bool, device=device).tril()[
            None, None
        ]


def rotary_follows_positions(model: torch.nn.Module) -> None:
    """Make a megatron ``GPTModel``'s rotary embedding use the position ids it is called with.

    ``GPTModel`` computes its rotary frequencies for positions ``0 .. T-1`` of every row and ignores
    ``position_ids``; a branch's positions continue from the prompt instead. Hooks (no parameters,
    no state-dict change) hand the call's ``[R, T]`` position ids to the rotary module, which then
    returns per-row frequencies ``[T, R, 1, D]`` (megatron's unfused RoPE broadcasts them over heads).
    """
    rotary = model.rotary_pos_emb
    called_with: dict[str, Tensor] = {}

    def remember(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        positions = kwargs["position_ids"] if "position_ids" in kwargs else args[1]
        if positions is None:
            raise ValueError("trainer.shared_prompts: the model must be called with the rows' position ids")
        called_with["positions"] = positions

    def at_positions(module: torch.nn.Module, args: tuple, output: Tensor) -> Tensor:
        positions = called_with["positions"]  # [R, T]
        if positions.shape[1] != output.shape[0]:
            raise ValueError(f"rotary embedding of {output.shape[0]} positions for rows of {positions.shape[1]}")
        return output[:, 0, 0][positions.t()].unsqueeze(2)  # [T, R, 1, D]

    model.register_forward_pre_hook(remember, with_kwargs=True)
    rotary.register_forward_hook(at_positions)
