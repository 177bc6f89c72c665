"""Shared-prompt training (``trainer.shared_prompts``): a prompt is computed once for all its completions.

A GRPO group is G completions of one prompt. Laid out one sample per row, the trainer runs the
prompt G times; in the embedded default the prompt is two thirds of every row. Here a row holds a
group's prompt once and then each of its completions as a *branch*::

    prompt[:-1] | prompt[-1] c1 ... | prompt[-1] c2 ... | ...      (branch ids 0 | 1 ... | 2 ... | ...)

Each branch starts with the prompt's last token, so that every position still predicts exactly one
next token (the one after it in the row) and the sample-space gather of ``hetrl.trainer.batch`` is
unchanged: completion token ``j`` of a branch starting at row offset ``o`` is read at ``o + j``.
A branch attends to the shared prompt and to itself (:func:`attention_mask`), and its positions
continue from the prompt's (``P - 1, P, ...``), which the model's rotary embedding follows
(:func:`rotary_follows_positions`): every completion token sees exactly the keys, positions and
values it sees in a row of its own, so log-probs and gradients are those of one row per sample, up
to rounding. The configuration checks refuse the layouts this cannot serve (context and sequence
parallelism, packing, images, routing replay, transformer-engine's attention).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from hetrl.types import Sample

PAD_BRANCH = -1  # the branch id of padding: a pad position sees the prompt and the padding before it, never a branch


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


def attention_mask(branches: Tensor) -> Tensor:
    """megatron's attention mask (True = masked) ``[R, 1, T, T]`` of rows of branch ids ``[R, T]``.

    Query ``q`` sees key ``k`` when ``k <= q`` and ``k`` is in the shared prompt (branch 0) or in
    ``q``'s own branch.
    """
    length = branches.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=branches.device).tril()
    same = branches[:, :, None] == branches[:, None, :]
    shared = (branches == 0)[:, None, :]
    return ~(causal & (same | shared))[:, None]


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
