"""Advantage estimators and reward shaping as pure functions.

Inputs: ``rewards`` ``[N]`` (one scalar score per response) or ``token_rewards`` ``[N, T]``,
``group_ids`` (one hashable per response: responses to the same prompt share it), ``mask``
``[N, T]`` (1.0 on policy tokens). Call these on the *whole* batch of a step, before it is split
into micro-batches: group and batch statistics must see every response.

Degenerate inputs never produce NaN: a group whose rewards are all equal, a single-response group
and a batch with a single valid token carry no relative signal and get advantage 0; zero-length
responses (an all-zero mask row) take part in their group's statistics but their advantages are 0
because they have no token to train on.

Where hetrl differs from verl (``verl/trainer/ppo/core_algos.py``) on purpose:

- **A single-response group gets advantage 0** (GRPO, Dr. GRPO, RLOO). verl's GRPO gives a
  singleton group mean 0 and std 1, so its advantage is the raw score (``score / (1 + 1e-6)``),
  and verl's RLOO leaves a singleton's raw score too. A raw score has no baseline: a batch with
  singletons (``group_size: 1``, a group cut down to one response) would push up every positively
  scored response, scaled by the reward's own range, unlike any other response of the batch.
  Use ``reinforce_pp`` for a baseline across prompts instead.
- **Whitening epsilon.** Group normalisation divides by ``std + 1e-6`` (:data:`_STD_EPS`, the
  unbiased std) exactly as verl's GRPO ``epsilon``; groups whose rewards are all equal get 0
  explicitly (verl: ``0 / 1e-6``, also 0). :func:`masked_whiten` uses the same ``std + 1e-6``,
  while verl's ``masked_whiten`` multiplies by ``rsqrt(var + 1e-8)``: an epsilon under the root,
  ~1e-4 on the std. The two agree (to < 1e-4 relative) once the std is above ~1e-2; below ~1e-4,
  verl shrinks the whitened values towards 0 and hetrl still scales them to unit spread. One
  epsilon for both keeps the two normalisations alike; an all-equal batch is 0 in either. verl
  also raises on a batch with one valid token, where hetrl returns 0.
- **Dr. GRPO's normaliser** lives in the loss (``losses.aggregate``,
  ``seq-mean-token-sum-norm``): ``sum_bt m x / (max_len * N_seq)`` with ``max_len`` the
  generation budget and ``N_seq`` the step's sequences, the paper's ``1/G sum_i sum_t`` with a
  constant length. verl's ``agg_loss`` divides a micro-batch's token sum by the width of its loss
  mask (the padded response length) and by no sequence count, so its loss grows with the
  sequences per micro-batch; hetrl's is a per-sequence mean, the same however the step is split.
  Dr. GRPO's advantage here is :func:`group_normalized` with ``scale_by_std=False``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

# Added to a standard deviation before dividing, as verl's GRPO (epsilon=1e-6): keeps a tiny but
# non-zero spread from inflating advantages to 1/std. Exactly-equal values are handled explicitly.
# masked_whiten uses it too (verl there: rsqrt(var + 1e-8)); see the module docstring.
_STD_EPS = 1e-6


def group_index(
    group_ids: Sequence[Any] | Tensor, num_samples: int, device: torch.device | None = None
) -> tuple[Tensor, int]:
    """Map arbitrary group ids to ``(index [N] in 0..G-1, G)``, in order of first appearance."""
    if isinstance(group_ids, Tensor):
        ids = group_ids.tolist()
    else:
        ids = list(group_ids)
    if len(ids) != num_samples:
        raise ValueError(f"got {len(ids)} group ids for {num_samples} rewards: pass one group id per response")
    first_seen: dict[Any, int] = {}
    index = [first_seen.setdefault(g, len(first_seen)) for g in ids]
    return torch.tensor(index, dtype=torch.long, device=device), len(first_seen)


def _group_stats(rewards: Tensor, group_ids: Sequence[Any] | Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-sample ``(group mean, unbiased group std, group size, group is constant)``, each ``[N]``."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [N] (one score per response), got shape {tuple(rewards.shape)}")
    rewards = rewards.float()
    index, num_groups = group_index(group_ids, rewards.numel(), rewards.device)
    zeros = rewards.new_zeros(num_groups)
    size = zeros.index_add(0, index, torch.ones_like(rewards))
    mean = zeros.index_add(0, index, rewards) / size
    sq_dev = (rewards - mean[index]).square()
    var = zeros.index_add(0, index, sq_dev) / (size - 1.0).clamp(min=1.0)
    high = torch.full_like(zeros, -torch.inf).scatter_reduce(0, index, rewards, "amax")
    low = torch.full_like(zeros, torch.inf).scatter_reduce(0, index, rewards, "amin")
    return mean[index], var.sqrt()[index], size[index], (high == low)[index]


def group_normalized(rewards: Tensor, group_ids: Sequence[Any] | Tensor, *, scale_by_std: bool = True) -> Tensor:
    """GRPO group-relative advantage of each response, ``[N]``.

    ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)`` (Shao et al. 2024, "DeepSeekMath", sec. 4.1.2),
    with the unbiased std of the response's group g. ``scale_by_std=False`` gives Dr. GRPO's
    ``A_i = r_i - mean_g(r)`` (Liu et al. 2025, "Understanding R1-Zero-Like Training"): dividing by
    the std over-weights groups that are nearly all right or all wrong.

    A group of one response, or of equal rewards, gets 0 (verl: the raw score for a singleton;
    see the module docstring).
    """
    mean, std, size, constant = _group_stats(rewards, group_ids)
    centred = rewards.float() - mean
    adv = centred / (std + _STD_EPS) if scale_by_std else centred
    return torch.where(constant | (size < 2), 0.0, adv)


def rloo(rewards: Tensor, group_ids: Sequence[Any] | Tensor) -> Tensor:
    """RLOO leave-one-out advantage, ``[N]`` (Ahmadian et al. 2024, "Back to Basics"; Kool et al. 2019).

    ``A_i = r_i - 1/(G-1) sum_{j != i} r_j = G/(G-1) (r_i - mean_g(r))``: the baseline excludes the
    response itself, so it is unbiased. A single-response group has no baseline: advantage 0
    (verl leaves its raw score).
    """
    mean, _, size, constant = _group_stats(rewards, group_ids)
    adv = size / (size - 1.0).clamp(min=1.0) * (rewards.float() - mean)
    return torch.where(constant | (size < 2), 0.0, adv)


def masked_whiten(x: Tensor, mask: Tensor) -> Tensor:
    """Normalise ``x`` over the valid tokens of the batch: ``(x - mean) / (std + eps)``, 0 off-mask.

    Mean and unbiased std are taken over all tokens with ``mask = 1``; ``eps = 1e-6`` is added to the
    std (verl: ``(x - mean) * rsqrt(var + 1e-8)``; see the module docstring). Fewer than two valid
    tokens, or all of them equal, give zeros.
    """
    if x.shape != mask.shape:
        raise ValueError(f"x and mask must share a shape, got {tuple(x.shape)} and {tuple(mask.shape)}")
    valid = mask > 0
    values = x.float()[valid]
    if values.numel() < 2 or bool(values.max() == values.min()):
        return torch.zeros_like(x, dtype=torch.float32)
    out = (x.float() - values.mean()) / (values.std() + _STD_EPS)
    return out * valid


def gae(token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over policy tokens (Schulman et al. 2016, "High-Dimensional
    Continuous Control Using GAE"). Returns ``(advantages, returns)``, both ``[N, T]``, 0 off-mask.

    ``delta_t = r_t + gamma V_{t'} - V_t`` and ``A_t = delta_t + gamma lam A_{t'}``, where ``t'`` is
    the next *policy* token of the sequence (``V = A = 0`` past the last one): environment tokens
    of a multi-turn episode (mask 0) are not actions, so the recursion steps over them; rewards on
    them are ignored (place rewards on policy tokens, see :func:`token_rewards`).
    ``returns = A + V`` is the value target. ``values`` are treated as constants.
    """
    if not token_rewards.shape == values.shape == mask.shape:
        shapes = [tuple(t.shape) for t in (token_rewards, values, mask)]
        raise ValueError(f"token_rewards, values and mask must share one [N, T] shape, got {shapes}")
    rewards, values, valid = token_rewards.float(), values.detach().float(), mask > 0
    advantages = torch.zeros_like(rewards)
    next_value = rewards.new_zeros(rewards.shape[0])
    next_adv = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        step_adv = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * next_adv
        here = valid[:, t]
        advantages[:, t] = torch.where(here, step_adv, 0.0)
        next_adv = torch.where(here, step_adv, next_adv)
        next_value = torch.where(here, values[:, t], next_value)
    return advantages, (advantages + values) * valid


def reinforce_pp(token_rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """REINFORCE++ advantage, ``[N, T]`` (Hu 2025, "REINFORCE++").

    The return-to-go ``G_t = sum_{s >= t} gamma^(s-t) r_s`` over policy tokens (the score sits on
    the last token, a folded-in KL penalty on every token), normalised across the whole batch of
    tokens (:func:`masked_whiten`) instead of per prompt group: a global baseline that does not
    overfit to a few responses per prompt.
    """
    returns, _ = gae(token_rewards, torch.zeros_like(token_rewards, dtype=torch.float32), mask, gamma, 1.0)
    return masked_whiten(returns, mask)


def token_rewards(scores: Tensor, mask: Tensor, kl: Tensor | None = None, kl_coef: float = 0.0) -> Tensor:
    """Per-token rewards ``[N, T]``: the response score on its last policy token, minus ``kl_coef * kl``.

    ``r_t = score * 1[t = last] - beta * KL_t`` on policy tokens: this folds the KL penalty into the
    reward (InstructGPT, Ouyang et al. 2022; REINFORCE++) instead of adding it to the loss. ``kl``
    is a per-token estimate (``losses.kl_estimate``). A zero-length response keeps its score at
    position 0 so that a per-sequence sum still sees it; its advantages are 0 anyway.
    """
    if scores.dim() != 1 or scores.shape[0] != mask.shape[0]:
        raise ValueError(
            f"scores must be [N] with N = mask rows, got {tuple(scores.shape)} vs mask {tuple(mask.shape)}"
        )
    valid = (mask > 0).float()
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    if mask.shape[1] == 0:
        return out
    positions = torch.arange(mask.shape[1], device=mask.device).expand(mask.shape)
    last = torch.where(valid > 0, positions, -1).amax(-1).clamp(min=0)
    out[torch.arange(mask.shape[0], device=mask.device), last] = scores.float()
    if kl is not None and kl_coef != 0.0:
        out = out - kl_coef * kl.detach().float() * valid
    return out


def broadcast(seq_advantages: Tensor, mask: Tensor) -> Tensor:
    """Spread one advantage per response ``[N]`` over its policy tokens: ``[N, T]``, 0 off-mask."""
    return torch.where(mask > 0, seq_advantages.float()[:, None], 0.0)


def overlong_penalty(lengths: Tensor, max_tokens: int, buffer: int, penalty: float = 1.0) -> Tensor:
    """DAPO soft overlong punishment, ``[N]`` to add to the scores (Yu et al. 2025, eq. 13).

    ``R(L) = 0`` if ``L <= L_max - L_buf``; ``((L_max - L_buf) - L) / L_buf`` inside the buffer;
    ``-1`` beyond ``L_max``; times ``penalty``. Truncated responses are penalised smoothly instead
    of getting the same reward as a wrong answer. ``buffer = 0`` disables it.
    """
    if buffer <= 0:
        return torch.zeros(lengths.shape, dtype=torch.float32, device=lengths.device)
    if buffer > max_tokens:
        raise ValueError(f"overlong buffer ({buffer}) must not exceed max_tokens ({max_tokens})")
    ramp = ((max_tokens - buffer) - lengths.float()) / buffer
    return ramp.clamp(-1.0, 0.0) * penalty


def informative_groups(rewards: Tensor, group_ids: Sequence[Any] | Tensor) -> Tensor:
    """Boolean ``[N]``: the response's group has rewards that are not all equal (DAPO dynamic sampling).

    Groups that are all right or all wrong have zero group-relative advantage and only dilute the
    batch; DAPO drops them and samples more prompts.
    """
    _, _, _, constant = _group_stats(rewards, group_ids)
    return ~constant
