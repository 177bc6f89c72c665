"""RL algorithms by name: compositions of ``losses`` and ``advantages``.

=============  ===================  =========================  ========================
name           advantage (default)  policy loss                aggregation (default)
=============  ===================  =========================  ========================
grpo           grpo                 PPO-clip                   token-mean
dr_grpo        grpo_no_std          PPO-clip                   seq-mean-token-sum-norm
dapo           grpo                 PPO-clip, clip-higher 0.28 token-mean
gspo           grpo                 PPO-clip on GSPO ratio     seq-mean-token-mean
cispo          grpo                 CISPO (clipped IS weight)  token-mean
rloo           rloo                 PPO-clip                   token-mean
reinforce_pp   reinforce_pp         PPO-clip                   token-mean
ppo            gae (value model)    PPO-clip                   token-mean
=============  ===================  =========================  ========================

ppo's value model is a model of its own (``hetrl.trainer.critic``) with its own optimizer: its
loss, :func:`compute_value_loss`, never mixes with the policy's.

Every algorithm also takes the optional pieces its config turns on: the train/inference
importance-sampling correction (``is_correction``: truncated, masked or IcePop, per token, sequence
or geometric mean; see ``losses.importance_weights``), a KL penalty to the reference policy (in the
loss, or folded into the reward by :func:`shape_rewards`), an entropy bonus and dual clip.
DAPO's dynamic sampling belongs to the rollout loop (``advantages.informative_groups``).

Call order per step: ``shape_rewards`` -> ``compute_advantages`` (and ``compute_value_targets``
for ppo) on the whole batch, then ``compute_loss`` (and ``compute_value_loss``) per micro-batch with the step's global
normalisers (``losses.count_tokens_and_seqs`` summed over micro-batches and ranks), summing the
returned losses; the returned metrics are normalised the same way, so they sum too.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor

from hetrl.config.algorithm import AlgorithmConfig
from hetrl.monitor import names
from hetrl.trainer import advantages as adv
from hetrl.trainer import losses

# Metrics of the loss that hetrl.monitor.names does not list (yet); the others use its constants.
# (The engine/trainer mismatch itself is measured from the samples by hetrl.monitor.mismatch.)
IS_WEIGHT_MEAN = "is/weight_mean"  # mean IS correction weight over policy tokens (0 for rejected ones)
IS_MASKED_FRAC = "is/masked_frac"  # fraction of policy tokens rejected by masked IS or IcePop (either bound)
IS_TRUNCATED_FRAC = "is/truncated_frac"  # fraction of policy tokens whose IS weight was capped
VALUE_CLIP_FRAC = "value/clip_frac"  # fraction of tokens where the clipped value branch is active (ppo)
CLIP_FRAC_DUAL = "clip_frac/dual"  # fraction of policy tokens bounded by dual clip (A < 0, r > c)
_CLIP_FRAC = {"low": names.CLIP_FRAC_LOW, "high": names.CLIP_FRAC_HIGH, "dual": CLIP_FRAC_DUAL}


@dataclass
class LossInputs:
    """Per-token tensors of one micro-batch, all ``[B, T]``."""

    logprobs: Tensor  # current policy log-probs of completion tokens (requires grad)
    old_logprobs: (
        Tensor  # policy the step starts from (trainer-recomputed; == logprobs.detach() on the first minibatch)
    )
    advantages: Tensor  # per-token advantages (sequence advantages broadcast)
    mask: Tensor  # float 1 for policy tokens to train on
    rollout_logprobs: Tensor | None = None  # engine log-probs, for the IS correction
    ref_logprobs: Tensor | None = None  # reference policy, for KL
    entropy: Tensor | None = None


def _policy_loss(algo: AlgorithmConfig, inputs: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token policy loss of the named algorithm and its clip masks (low/high/dual)."""
    if algo.name == "cispo":
        per_token, truncated = losses.cispo_loss(
            inputs.logprobs, inputs.old_logprobs, inputs.advantages, algo.cispo_clip_high
        )
        return per_token, {"low": torch.zeros_like(truncated), "high": truncated}
    if algo.name == "gspo":
        ratio = losses.gspo_ratio(inputs.logprobs, inputs.old_logprobs, inputs.mask)
        return losses.clipped_surrogate(ratio, inputs.advantages, algo.gspo_clip, algo.gspo_clip_high, algo.dual_clip)
    ratio = losses.ppo_ratio(inputs.logprobs, inputs.old_logprobs)
    return losses.clipped_surrogate(ratio, inputs.advantages, algo.clip_low, algo.resolved_clip_high, algo.dual_clip)


def _is_weights(
    algo: AlgorithmConfig, inputs: LossInputs, metrics: dict[str, Tensor], token_mean: Callable[[Tensor], Tensor]
) -> Tensor | None:
    """The IS correction weights (None when off), recording their metrics."""
    if algo.is_correction == "none":
        return None
    if inputs.rollout_logprobs is None:
        warnings.warn(
            f"algorithm.is_correction={algo.is_correction!r} is ignored: no rollout_logprobs were given", stacklevel=3
        )
        return None
    weights, rejected, truncated = losses.importance_weights(
        inputs.old_logprobs,
        inputs.rollout_logprobs,
        inputs.mask,
        algo.is_correction,
        algo.is_level,
        algo.is_threshold,
        algo.resolved_is_threshold_low,
    )
    metrics[IS_WEIGHT_MEAN] = token_mean(weights)
    metrics[IS_MASKED_FRAC] = token_mean(rejected.float())
    metrics[IS_TRUNCATED_FRAC] = token_mean(truncated.float())
    return weights


def _require(inputs: LossInputs, fields: Sequence[str], why: str) -> None:
    missing = [field for field in fields if getattr(inputs, field) is None]
    if missing:
        raise ValueError(f"{why} needs LossInputs.{', '.join(missing)}")


def compute_loss(
    algo: AlgorithmConfig,
    inputs: LossInputs,
    *,
    num_global_tokens: Tensor | float | None = None,
    num_global_seqs: Tensor | float | None = None,
    max_len: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Loss of one micro-batch and its detached metrics.

    ``loss/total = loss/policy + kl_coef * loss/kl - entropy_coef * loss/entropy``, each part an ``agg``
    (``losses.aggregate`` with the algorithm's aggregation mode
    and the given global normalisers; None: this micro-batch's own): ``loss/policy`` of the
    IS-weighted per-token policy loss, ``loss/kl`` of ``KL_k(pi || pi_ref)`` with the configured
    estimator (only when ``kl_coef > 0`` and the KL is not folded into the reward),
    ``loss/entropy`` of the entropy (only when ``entropy_coef > 0``). The parts are reported before
    their coefficients, as hetrl.monitor.names documents them.

    The other metrics are token-means over policy tokens with the same ``num_global_tokens``, so
    they too sum over micro-batches: ``clip_frac/low``, ``clip_frac/high`` (``clip_frac/dual`` with
    dual clip), ``policy_kl`` (k3 estimate of KL(pi_old || pi)), and when their inputs are present
    ``approx_kl`` (k3 estimate of KL(pi || pi_ref)), ``entropy``, ``is/weight_mean``,
    ``is/masked_frac`` and ``is/truncated_frac``.
    """
    mask = inputs.mask.float()
    agg = partial(
        losses.aggregate,
        mask=mask,
        mode=algo.resolved_loss_aggregation,
        num_global_tokens=num_global_tokens,
        num_global_seqs=num_global_seqs,
        max_len=max_len,
    )
    token_mean = partial(losses.token_mean, mask=mask, num_global_tokens=num_global_tokens)
    metrics: dict[str, Tensor] = {}
    per_token, clipped = _policy_loss(algo, inputs)
    weights = _is_weights(algo, inputs, metrics, token_mean)
    parts = {names.LOSS_POLICY: (1.0, agg(per_token if weights is None else per_token * weights))}
    for kind, active in clipped.items():
        metrics[_CLIP_FRAC[kind]] = token_mean(active.float())
    metrics[names.POLICY_KL] = token_mean(losses.kl_estimate(inputs.old_logprobs, inputs.logprobs, "k3"))

    kl_in_loss = algo.kl_coef > 0 and not algo.kl_in_reward
    if kl_in_loss:
        _require(inputs, ["ref_logprobs"], f"algorithm.kl_coef={algo.kl_coef} (KL in the loss)")
    if inputs.ref_logprobs is not None:
        ref = inputs.ref_logprobs.detach()
        metrics[names.APPROX_KL] = token_mean(losses.kl_estimate(inputs.logprobs, ref, "k3"))
        if kl_in_loss:
            parts[names.LOSS_KL] = (algo.kl_coef, agg(losses.kl_estimate(inputs.logprobs, ref, algo.kl_estimator)))
    if algo.entropy_coef > 0:
        _require(inputs, ["entropy"], f"algorithm.entropy_coef={algo.entropy_coef}")
        parts[names.LOSS_ENTROPY] = (-algo.entropy_coef, agg(inputs.entropy))
    if inputs.entropy is not None:
        metrics[names.ENTROPY] = token_mean(inputs.entropy)
    total = sum(coef * part for coef, part in parts.values())
    metrics.update({name: part.detach() for name, (_, part) in parts.items()})
    metrics[names.LOSS_TOTAL] = total.detach()
    return total, metrics


def compute_value_loss(
    algo: AlgorithmConfig,
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    num_global_tokens: Tensor | float | None = None,
    num_global_seqs: Tensor | float | None = None,
    max_len: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's value loss of one micro-batch (the clipped value loss) and its metrics.

    Aggregated like the policy loss (the algorithm's aggregation, the step's global normalisers),
    so micro-batch shares sum to the step's loss. Metrics, token-means over policy tokens that sum
    the same way: ``loss/value``, ``value/clip_frac``, ``value/mean``. No coefficient weighs it:
    the critic has an optimizer of its own, which a constant loss scale would not change (Adam).
    """
    mask = mask.float()
    per_token, clipped = losses.clipped_value_loss(values, old_values, returns, algo.value_clip)
    loss = losses.aggregate(
        per_token,
        mask,
        algo.resolved_loss_aggregation,
        num_global_tokens=num_global_tokens,
        num_global_seqs=num_global_seqs,
        max_len=max_len,
    )
    token_mean = partial(losses.token_mean, mask=mask, num_global_tokens=num_global_tokens)
    metrics = {
        names.LOSS_VALUE: loss.detach(),
        VALUE_CLIP_FRAC: token_mean(clipped.float()),
        names.VALUE_MEAN: token_mean(values.detach()),
    }
    return loss, metrics


def advantage_metrics(advantages: Tensor, mask: Tensor) -> dict[str, float]:
    """``advantage/mean`` and ``advantage/std`` over the policy tokens of a whole batch (0 when empty).

    A std of 0 means the batch carries no learning signal (e.g. every group's rewards equal).
    """
    values = advantages.detach().float()[mask > 0]
    if values.numel() == 0:
        return {names.ADVANTAGE_MEAN: 0.0, names.ADVANTAGE_STD: 0.0}
    return {names.ADVANTAGE_MEAN: float(values.mean()), names.ADVANTAGE_STD: float(values.std(correction=0))}


def shape_rewards(
    algo: AlgorithmConfig,
    scores: Tensor,
    mask: Tensor,
    *,
    old_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    lengths: Tensor | None = None,
    max_tokens: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Apply the config's reward shaping to the verifier scores ``[N]``; the rewards and their metrics.

    DAPO's soft overlong punishment when ``overlong_buffer > 0`` (``lengths`` default to the
    number of policy tokens; ``max_tokens`` is the generation budget), and the KL penalty when
    ``kl_in_reward``: then the rewards are per-token ``[N, T]`` (``advantages.token_rewards``),
    otherwise ``[N]``. Either form goes to :func:`compute_advantages`. The metrics are read off the
    returned rewards, so they show what the advantages will see: ``reward/shaped_mean`` (each
    response's reward summed over its tokens, averaged) and, with the KL in the reward,
    ``reward/kl_penalty`` (what the KL took from a response's reward, ``kl_coef * sum_t KL_t``, averaged).
    """
    shaped = scores.float()
    if algo.overlong_buffer > 0:
        if max_tokens is None:
            raise ValueError("algorithm.overlong_buffer > 0 needs max_tokens (the rollout generation budget)")
        lengths = mask.float().sum(-1) if lengths is None else lengths
        shaped = shaped + adv.overlong_penalty(lengths, max_tokens, algo.overlong_buffer, algo.overlong_penalty)
    if not (algo.kl_in_reward and algo.kl_coef > 0):
        return shaped, {names.REWARD_SHAPED_MEAN: float(shaped.mean())}
    if old_logprobs is None or ref_logprobs is None:
        raise ValueError("algorithm.kl_in_reward needs old_logprobs and ref_logprobs to fold the KL into the reward")
    kl = losses.kl_estimate(old_logprobs.detach(), ref_logprobs.detach(), algo.kl_estimator)
    rewards = adv.token_rewards(shaped, mask, kl, algo.kl_coef)
    totals = rewards.sum(-1)
    return rewards, {
        names.REWARD_SHAPED_MEAN: float(totals.mean()),
        names.REWARD_KL_PENALTY: float((shaped - totals).mean()),
    }


def _token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    return rewards.float() if rewards.dim() == 2 else adv.token_rewards(rewards, mask)


def compute_advantages(
    algo: AlgorithmConfig,
    rewards: Tensor,
    group_ids: Sequence[Any] | Tensor,
    mask: Tensor,
    values: Tensor | None = None,
) -> Tensor:
    """Per-token advantages ``[N, T]`` (0 off-mask) of the whole batch of a step.

    ``rewards`` is ``[N]`` (scores) or ``[N, T]`` (per-token rewards from :func:`shape_rewards`);
    the group estimators (grpo, grpo_no_std, rloo) use each response's total ``sum_t r_t``, the
    token-level ones (reinforce_pp, gae) the per-token rewards, with an ``[N]`` score placed on
    the last policy token. ``gae`` needs the value model's ``values`` ``[N, T]`` at rollout time
    and whitens the advantages over the batch, as PPO implementations do.
    """
    if (
        rewards.dim() not in (1, 2)
        or rewards.shape[0] != mask.shape[0]
        or (rewards.dim() == 2 and rewards.shape != mask.shape)
    ):
        raise ValueError(f"rewards must be [N] or [N, T] matching mask {tuple(mask.shape)}, got {tuple(rewards.shape)}")
    estimator = algo.resolved_advantage
    if estimator in ("grpo", "grpo_no_std", "rloo"):
        scores = rewards.float() if rewards.dim() == 1 else rewards.float().sum(-1)
        if estimator == "rloo":
            return adv.broadcast(adv.rloo(scores, group_ids), mask)
        return adv.broadcast(adv.group_normalized(scores, group_ids, scale_by_std=estimator == "grpo"), mask)
    if estimator == "reinforce_pp":
        return adv.reinforce_pp(_token_rewards(rewards, mask), mask, algo.gamma)
    if estimator == "gae":
        if values is None:
            raise ValueError("advantage 'gae' (ppo) needs the value model's values [N, T]")
        advantages, _ = adv.gae(_token_rewards(rewards, mask), values, mask, algo.gamma, algo.lam)
        return adv.masked_whiten(advantages, mask)
    raise ValueError(f"unknown advantage estimator {estimator!r}; valid: grpo, grpo_no_std, rloo, reinforce_pp, gae")


def compute_value_targets(algo: AlgorithmConfig, rewards: Tensor, mask: Tensor, values: Tensor) -> Tensor:
    """PPO value targets ``R_t = A_t^GAE + V_t`` ``[N, T]`` (before whitening), for ``LossInputs.returns``."""
    _, returns = adv.gae(_token_rewards(rewards, mask), values, mask, algo.gamma, algo.lam)
    return returns
