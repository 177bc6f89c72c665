"""Policy-gradient loss pieces as pure functions of per-token tensors.

Every tensor argument is ``[B, T]`` (B sequences, T completion positions, right-padded) unless
said otherwise, and ``mask`` is 1.0 on the policy tokens to train on (0 on padding and on
environment-observation tokens of a multi-turn episode). Nothing here knows about Megatron,
process groups or micro-batches: the one place where batching matters is :func:`aggregate`,
whose *global normalisers* make a sum over micro-batches and data-parallel ranks equal the loss
of the whole batch (see its docstring). ``hetrl.trainer.algorithms`` composes these pieces by
algorithm name.

Notation: ``r = exp(logp - logp_old)`` is the PPO ratio, ``A`` the advantage, ``eps_low`` /
``eps_high`` the clip ranges, ``sg`` stop-gradient.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from hetrl.config.algorithm import LossAggregation

KLEstimator = Literal["k1", "k2", "k3"]
ISMode = Literal["none", "truncated", "masked", "icepop"]
ISLevel = Literal["token", "sequence", "geometric"]

# exp() of a log-ratio beyond +-20 (a factor ~5e8) only ever means a broken sample; clamping keeps
# the ratio finite so that one such token cannot turn the whole loss into inf/NaN.
_MAX_LOG_RATIO = 20.0
# The k3 estimate is clamped to [-10, 10] (verl's kl_penalty does the same for 'low_var_kl' alone):
# exp(-d) still reaches ~5e8 inside the log-ratio clamp, and d/dlogp k3 = 1 - exp(-d) with it.
_MAX_K3 = 10.0


def _safe_exp(log_ratio: Tensor) -> Tensor:
    return torch.exp(log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))


def _check_same_shape(**tensors: Tensor | None) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items() if t is not None}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"per-token tensors must share one [B, T] shape, got {shapes}")


def count_tokens_and_seqs(mask: Tensor) -> tuple[float, float]:
    """Return ``(num_tokens, num_seqs)`` of one (micro-)batch: the global normalisers' summands.

    A sequence counts when it has at least one policy token; padding rows and zero-length
    responses count for nothing, so they may be added to any micro-batch freely. Sum both
    figures over all micro-batches and data-parallel ranks of a step to get the arguments
    ``num_global_tokens`` / ``num_global_seqs`` of :func:`aggregate`.
    """
    mask = mask.float()
    return float(mask.sum()), float((mask.sum(-1) > 0).sum())


def _at_least_one(count: Tensor | float) -> Tensor | float:
    """An empty batch divides by 1, not 0 (its numerator is 0 anyway); a tensor stays on device, unsynced."""
    return count.clamp(min=1.0) if isinstance(count, Tensor) else max(float(count), 1.0)


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    mode: LossAggregation,
    *,
    num_global_tokens: Tensor | float | None = None,
    num_global_seqs: Tensor | float | None = None,
    max_len: int | None = None,
) -> Tensor:
    """Reduce a per-token loss ``x[b, t]`` over policy tokens ``m[b, t]`` to an fp32 scalar.

    - ``token-mean`` (DAPO, Yu et al. 2025): ``sum_bt m x / N_tok``. Every token weighs the same,
      so long responses are not diluted.
    - ``seq-mean-token-mean`` (the original GRPO, Shao et al. 2024; GSPO): ``sum_b [sum_t m x /
      sum_t m] / N_seq``. Every sequence weighs the same.
    - ``seq-mean-token-sum-norm`` (Dr. GRPO, Liu et al. 2025): ``sum_bt m x / (max_len * N_seq)``
      with a constant ``max_len`` (the generation budget), which removes the length bias of
      dividing by each response's own length. verl's ``agg_loss`` divides by the mask's width
      alone, not by ``N_seq`` too (see ``hetrl.trainer.advantages``' docstring).

    ``N_tok`` / ``N_seq`` default to this batch's own counts (see :func:`count_tokens_and_seqs`).
    Passing the counts of the whole optimizer step instead makes every term of the sum a share
    of the step's loss: summing the returned values over micro-batches and ranks (the gradient
    all-reduce *sums*, it must not average) gives exactly the loss and gradient of one big batch.
    ``max_len`` is required for ``seq-mean-token-sum-norm``: a micro-batch's padded width differs
    from batch to batch and would silently change the normaliser. An empty batch returns 0
    (connected to the graph, so backward still runs on every rank).
    """
    _check_same_shape(per_token=per_token, mask=mask)
    # Sums and counts in fp32 even for a bf16 loss: bf16 cannot even count past 256 exactly.
    mask = mask.float()
    masked = per_token.float() * mask
    if mode == "token-mean":
        denom_tokens = mask.sum() if num_global_tokens is None else num_global_tokens
        return masked.sum() / _at_least_one(denom_tokens)
    tokens_per_seq = mask.sum(-1)
    denom_seqs = _at_least_one((tokens_per_seq > 0).float().sum() if num_global_seqs is None else num_global_seqs)
    if mode == "seq-mean-token-mean":
        return (masked.sum(-1) / tokens_per_seq.clamp(min=1.0)).sum() / denom_seqs
    if mode == "seq-mean-token-sum-norm":
        if max_len is None or max_len <= 0:
            raise ValueError(
                "loss aggregation 'seq-mean-token-sum-norm' needs max_len > 0: pass the generation budget (rollout "
                "max_tokens)"
            )
        return masked.sum() / (float(max_len) * denom_seqs)
    raise ValueError(
        f"unknown loss aggregation {mode!r}; valid: token-mean, seq-mean-token-mean, seq-mean-token-sum-norm"
    )


def token_mean(x: Tensor, mask: Tensor, num_global_tokens: Tensor | float | None = None) -> Tensor:
    """``sum_bt m x / N_tok`` of a metric, detached; summable over micro-batches like the loss."""
    return aggregate(x.detach().float(), mask, "token-mean", num_global_tokens=num_global_tokens)


def ppo_ratio(logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    """Token-level importance ratio ``r_t = pi(y_t) / pi_old(y_t) = exp(logp_t - sg(logp_old_t))``."""
    _check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs)
    return _safe_exp(logprobs - old_logprobs.detach())


def gspo_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """GSPO-token ratio (Zheng et al. 2025, "Group Sequence Policy Optimization", GSPO-token).

    The sequence ratio is the length-normalised likelihood ratio
    ``s_i = exp((1/|y_i|) sum_t m_t (logp_t - logp_old_t))``; its per-token form
    ``s_it = sg(s_i) * pi(y_t) / sg(pi(y_t))`` has the value ``s_i`` at every token and gradient
    ``s_i * grad logp_t``. With a sequence-constant advantage and ``seq-mean-token-mean``
    aggregation its gradient equals GSPO's sequence objective, while per-token advantages remain
    possible. Padding positions get ratio 1 (they are masked out downstream).
    """
    _check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs, mask=mask)
    mask = mask.to(logprobs.dtype)
    log_diff = (logprobs - old_logprobs.detach()) * mask
    seq_log_ratio = log_diff.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
    token_log_ratio = seq_log_ratio.detach() + logprobs - logprobs.detach()
    return _safe_exp(token_log_ratio) * mask + (1.0 - mask)


def clipped_surrogate(
    ratio: Tensor,
    advantages: Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-clip per-token loss with asymmetric clipping and optional dual clip.

    ``l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))`` (Schulman et al. 2017, "Proximal
    Policy Optimization Algorithms", eq. 7, negated for minimisation). Separate ``eps_low`` and
    ``eps_high`` is DAPO's clip-higher (Yu et al. 2025): a larger ``eps_high`` lets unlikely tokens
    with positive advantage grow, which keeps entropy from collapsing. Dual clip (Ye et al. 2020,
    "Mastering Complex Control in MOBA Games with Deep Reinforcement Learning"): for ``A < 0`` the loss is
    further bounded by ``-c A`` (c > 1), so a huge ratio on a bad token cannot blow up the update.

    Returns the per-token loss and boolean masks of where each clip is active (gradient zero):
    ``low`` (r < 1 - eps_low and A < 0), ``high`` (r > 1 + eps_high and A > 0) and ``dual``
    (A < 0 and r > c).
    """
    _check_same_shape(ratio=ratio, advantages=advantages)
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    active = {
        "low": (ratio < 1.0 - clip_low) & (advantages < 0),
        "high": (ratio > 1.0 + clip_high) & (advantages > 0),
    }
    if dual_clip is not None:
        negative = advantages < 0
        loss = torch.where(negative, torch.minimum(loss, -advantages * dual_clip), loss)
        active["dual"] = negative & (ratio > dual_clip)
    return loss, active


def cispo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, clip_high: float) -> tuple[Tensor, Tensor]:
    """CISPO per-token loss (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
    Attention").

    ``l_t = -sg(min(r_t, 1 + eps_high)) * A_t * logp_t``. Unlike PPO-clip, which drops the gradient
    of clipped tokens entirely, CISPO clips only the (stop-gradient) importance weight, so every
    token keeps a REINFORCE gradient; the paper sets no lower bound. Returns the per-token loss
    and the mask of tokens whose weight was truncated.
    """
    ratio = ppo_ratio(logprobs, old_logprobs).detach()
    _check_same_shape(ratio=ratio, advantages=advantages)
    truncated = ratio > 1.0 + clip_high
    weight = ratio.clamp(max=1.0 + clip_high)
    return -weight * advantages * logprobs, truncated


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, estimator: KLEstimator) -> Tensor:
    """Per-token estimate of ``KL(pi || pi_ref)`` from samples of ``pi`` (Schulman 2020, "Approximating KL Divergence").

    With ``d = logp - logp_ref``:
    ``k1 = d`` (unbiased, high variance, can be negative); ``k2 = d^2 / 2`` (low variance, biased;
    its gradient is the true KL gradient); ``k3 = clamp(exp(-d) - 1 + d, -10, 10)`` (always >= 0;
    GRPO's choice). Gradients flow into both arguments; detach the reference as needed (it is frozen).

    k3 alone is clamped, as verl's ``kl_penalty`` clamps ``low_var_kl`` alone: its gradient
    ``d k3 / d logp = 1 - exp(-d)`` grows exponentially where the policy has pushed a token far
    below the reference (``d << 0``), so one such token would dominate the step's update. Past 10
    (``d < -2.61`` or ``d > 11``) the token's estimate is 10 and its gradient zero; this also makes
    k3 biased low on such tokens (it is unbiased only unclamped). k1 and k2 grow linearly and
    quadratically and are left as they are. ``d`` itself is first clamped to ``[-20, 20]`` so
    that ``exp`` stays finite.
    """
    _check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    d = logprobs - ref_logprobs
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d.square()
    if estimator == "k3":
        d = d.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        return (torch.exp(-d) - 1.0 + d).clamp(-_MAX_K3, _MAX_K3)
    raise ValueError(f"unknown KL estimator {estimator!r}; valid: k1, k2, k3")


def importance_weights(
    old_logprobs: Tensor,
    rollout_logprobs: Tensor,
    mask: Tensor,
    mode: ISMode,
    level: ISLevel,
    threshold: float,
    threshold_low: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Stop-gradient weights correcting the trainer/inference-engine mismatch.

    The engine samples from ``mu`` (its own kernels, precision, maybe stale weights) while the
    trainer computes ``pi_old``; the policy gradient needs ``w = pi_old / mu``. With ``d_t = m_t
    (logp_old_t - logp_mu_t)`` and ``|y_i| = sum_t m_t``, by ``level``:

    - ``token``: ``w_t = exp(d_t)``.
    - ``sequence``: ``w_i = exp(sum_t d_t)``, the likelihood ratio of the whole response, broadcast
      over its tokens. Exact, but it is a product of ``|y_i|`` token ratios: a long response drifts
      far from 1 even when every token agrees closely.
    - ``geometric``: ``w_i = exp(sum_t d_t / |y_i|)``, the per-token geometric mean of the
      ratios (verl's geometric rejection sampling), broadcast likewise; it does not grow with
      length, so one bound suits short and long responses alike.

    and by ``mode``, with ``C = threshold`` (> 1) and ``c = threshold_low`` (in (0, 1)):

    - ``truncated`` (TIS; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
      Off-Policy RL Training", flash-rl): ``min(w, C)``; bounded variance, small bias.
    - ``masked`` (MIS; Liu, Yao et al. 2025, "When Speed Kills Stability"): ``w * 1[w <= C]``,
      and ``w * 1[c <= w <= C]`` when ``c`` is given; tokens or whole sequences whose mismatch is
      too large are rejected (weight 0) rather than trusted at the cap.
    - ``icepop`` (Ling team 2025, "Small Leak Can Sink a Great Ship: Boost RL Training on MoE
      with IcePop"): the token-level two-sided mask ``M(w_t) = w_t * 1[c <= w_t <= C]``; the paper
      uses ``c = 0.5``, ``C = 5``. It equals ``masked`` at ``token`` level with ``c`` given, and
      needs both: ``c`` is required and any other level is refused.
    - ``none``: weight 1.

    Rejected tokens stay in the loss normaliser (they are not re-counted), so a rejection removes
    the token's gradient and nothing else. Returns ``(weights, rejected, truncated)``: weights
    ``[B, T]`` (0 on padding) and boolean masks of the policy tokens rejected (masked, icepop; on
    either side) and capped (truncated).
    """
    _check_same_shape(old_logprobs=old_logprobs, rollout_logprobs=rollout_logprobs, mask=mask)
    if threshold <= 1.0:
        raise ValueError(f"IS threshold must be > 1, got {threshold}")
    if threshold_low is not None and not 0.0 < threshold_low < 1.0:
        raise ValueError(f"IS lower threshold must be in (0, 1), got {threshold_low}")
    if level not in ("token", "sequence", "geometric"):
        raise ValueError(f"unknown IS level {level!r}; valid: token, sequence, geometric")
    mask = mask.to(old_logprobs.dtype)
    valid = mask > 0
    none = torch.zeros_like(valid)
    if mode == "none":
        return mask.clone(), none, none
    if mode == "icepop" and (level != "token" or threshold_low is None):
        raise ValueError(
            f"IcePop is a token-level two-sided mask: it needs level 'token' (got {level!r}) and a threshold_low "
            f"(got {threshold_low}); for a two-sided sequence mask use mode 'masked' with threshold_low"
        )
    if mode == "truncated" and threshold_low is not None:
        raise ValueError("truncated IS has no lower bound: threshold_low applies to 'masked' and 'icepop' only")
    log_w = ((old_logprobs - rollout_logprobs) * mask).detach()
    if level == "sequence":
        log_w = log_w.sum(-1, keepdim=True).expand_as(mask)
    elif level == "geometric":
        log_w = (log_w.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)).expand_as(mask)
    log_cap = math.log(threshold)
    over = (log_w > log_cap) & valid
    if mode == "truncated":
        return _safe_exp(log_w.clamp(max=log_cap)) * mask, none, over
    if mode in ("masked", "icepop"):
        rejected = over if threshold_low is None else over | ((log_w < math.log(threshold_low)) & valid)
        return torch.where(rejected, 0.0, _safe_exp(log_w)) * mask, rejected, none
    raise ValueError(f"unknown IS correction {mode!r}; valid: none, truncated, masked, icepop")


def clipped_value_loss(values: Tensor, old_values: Tensor, returns: Tensor, clip: float) -> tuple[Tensor, Tensor]:
    """PPO clipped value loss (Schulman et al. 2017; the clipping as in OpenAI baselines' ppo2).

    ``l_t = 1/2 max((V_t - R_t)^2, (V_old_t + clip(V_t - V_old_t, -eps_v, eps_v) - R_t)^2)``: the
    value head may not move further than ``eps_v`` from the rollout-time values in one step.
    Returns the per-token loss and the mask of tokens where the clipped branch is larger (the clip is active).
    """
    _check_same_shape(values=values, old_values=old_values, returns=returns)
    old_values, returns = old_values.detach(), returns.detach()
    clipped_values = old_values + (values - old_values).clamp(-clip, clip)
    unclipped_err = (values - returns).square()
    clipped_err = (clipped_values - returns).square()
    # The clipped branch counts only where the clip moved the value: where it did not, the two
    # branches are equal and round-off alone would decide.
    active = (clipped_err > unclipped_err) & ((values - old_values).abs() > clip)
    return 0.5 * torch.maximum(unclipped_err, clipped_err), active
