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
ppo            gae (value model)    PPO-clip + value loss      token-mean
=============  ===================  =========================  ========================

Every algorithm also takes the optional pieces its config turns on: the train/inference
importance-sampling correction (``is_correction``), a KL penalty to the reference policy (in the
loss, or folded into the reward by :func:`shape_rewards`), an entropy bonus and dual clip.
DAPO's dynamic sampling belongs to the rollout loop (``advantages.informative_groups``).

Call order per step: ``shape_rewards`` -> ``compute_advantages`` (and ``compute_value_targets``
for ppo) on the whole batch, then ``compute_loss`` per micro-batch with the step's global
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
from hetrl.trainer import advantages as adv
from hetrl.trainer import losses


@dataclass
class LossInputs:
    """Per-token tensors of one micro-batch, all ``[B, T]``."""

    logprobs: Tensor  # current policy log-probs of completion tokens (requires grad)
    old_logprobs: Tensor  # policy the step starts from (trainer-recomputed; == logprobs.detach() on the first minibatch)
    advantages: Tensor  # per-token advantages (sequence advantages broadcast)
    mask: Tensor  # float 1 for policy tokens to train on
    rollout_logprobs: Tensor | None = None  # engine log-probs, for the IS correction
    ref_logprobs: Tensor | None = None  # reference policy, for KL
    entropy: Tensor | None = None
    values: Tensor | None = None  # ppo value head output (requires grad)
    old_values: Tensor | None = None
    returns: Tensor | None = None


def _policy_loss(algo: AlgorithmConfig, inputs: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token policy loss of the named algorithm and its clip masks (low/high/dual)."""
    if algo.name == "cispo":
        per_token, truncated = losses.cispo_loss(inputs.logprobs, inputs.old_logprobs, inputs.advantages, algo.cispo_clip_high)
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
        warnings.warn(f"algorithm.is_correction={algo.is_correction!r} is ignored: no rollout_logprobs were given", stacklevel=3)
        return None
    weights, rejected, truncated = losses.importance_weights(
        inputs.old_logprobs, inputs.rollout_logprobs, inputs.mask, algo.is_correction, algo.is_level, algo.is_threshold
    )
    metrics["is/weight_mean"] = token_mean(weights)
    metrics["is/masked_frac"] = token_mean(rejected.float())
    metrics["is/truncated_frac"] = token_mean(truncated.float())
    metrics["is/mismatch_kl"] = token_mean(losses.kl_estimate(inputs.rollout_logprobs, inputs.old_logprobs, "k3"))
    return weights


def _require(inputs: LossInputs, names: Sequence[str], why: str) -> None:
    missing = [name for name in names if getattr(inputs, name) is None]
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

    ``loss = loss/policy + loss/kl + loss/entropy + loss/value`` where ``loss/policy`` aggregates
    the (IS-weighted) per-token policy loss, ``loss/kl = kl_coef * agg(KL_k(pi || pi_ref))`` (unless
    the KL is folded into the reward), ``loss/entropy = -entropy_coef * agg(H)`` and ``loss/value =
    value_coef * agg(clipped value loss)`` (ppo). ``agg`` is ``losses.aggregate`` with the
    algorithm's aggregation mode and the given global normalisers (None: this micro-batch's own).

    Metrics (each a token-mean over policy tokens with the same ``num_global_tokens``, so they sum
    over micro-batches): ``loss/*``, ``clip_frac/low``, ``clip_frac/high`` (``clip_frac/dual``
    with dual clip), ``approx_kl`` (k3 estimate of KL(pi_old || pi)), and when their inputs are
    present ``entropy``, ``kl_ref``, ``is/weight_mean``, ``is/masked_frac``, ``is/truncated_frac``,
    ``is/mismatch_kl``, ``value/clip_frac``.
    """
    mask = inputs.mask.float()
    agg = partial(losses.aggregate, mask=mask, mode=algo.resolved_loss_aggregation,
                  num_global_tokens=num_global_tokens, num_global_seqs=num_global_seqs, max_len=max_len)
    token_mean = partial(losses.token_mean, mask=mask, num_global_tokens=num_global_tokens)
    metrics: dict[str, Tensor] = {}

    per_token, clipped = _policy_loss(algo, inputs)
    weights = _is_weights(algo, inputs, metrics, token_mean)
    policy = agg(per_token if weights is None else per_token * weights)
    total = policy
    metrics["loss/policy"] = policy.detach()
    for kind, active in clipped.items():
        metrics[f"clip_frac/{kind}"] = token_mean(active.float())
    metrics["approx_kl"] = token_mean(losses.kl_estimate(inputs.old_logprobs, inputs.logprobs, "k3"))

    if inputs.ref_logprobs is not None:
        kl = losses.kl_estimate(inputs.logprobs, inputs.ref_logprobs.detach(), algo.kl_estimator)
        metrics["kl_ref"] = token_mean(kl)
        if algo.kl_coef > 0 and not algo.kl_in_reward:
            kl_loss = algo.kl_coef * agg(kl)
            total = total + kl_loss
            metrics["loss/kl"] = kl_loss.detach()
    elif algo.kl_coef > 0 and not algo.kl_in_reward:
        _require(inputs, ["ref_logprobs"], f"algorithm.kl_coef={algo.kl_coef} (KL in the loss)")

    if algo.entropy_coef > 0:
        _require(inputs, ["entropy"], f"algorithm.entropy_coef={algo.entropy_coef}")
    if inputs.entropy is not None:
        metrics["entropy"] = token_mean(inputs.entropy)
        if algo.entropy_coef > 0:
            entropy_loss = -algo.entropy_coef * agg(inputs.entropy)
            total = total + entropy_loss
            metrics["loss/entropy"] = entropy_loss.detach()

    if algo.name == "ppo":
        _require(inputs, ["values", "old_values", "returns"], "algorithm ppo (value loss)")
        value_per_token, value_clipped = losses.clipped_value_loss(
            inputs.values, inputs.old_values, inputs.returns, algo.value_clip
        )
        value_loss = algo.value_coef * agg(value_per_token)
        total = total + value_loss
        metrics["loss/value"] = value_loss.detach()
        metrics["value/clip_frac"] = token_mean(value_clipped.float())

    metrics["loss/total"] = total.detach()
    return total, metrics


def shape_rewards(
    algo: AlgorithmConfig,
    scores: Tensor,
    mask: Tensor,
    *,
    old_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    lengths: Tensor | None = None,
    max_tokens: int | None = None,
) -> Tensor:
    """Apply the config's reward shaping to the verifier scores ``[N]``.

    DAPO's soft overlong punishment when ``overlong_buffer > 0`` (``lengths`` default to the
    number of policy tokens; ``max_tokens`` is the generation budget), and the KL penalty when
    ``kl_in_reward``: then the result is per-token ``[N, T]`` (``advantages.token_rewards``),
    otherwise ``[N]``. Either form goes to :func:`compute_advantages`.
    """
    shaped = scores.float()
    if algo.overlong_buffer > 0:
        if max_tokens is None:
            raise ValueError("algorithm.overlong_buffer > 0 needs max_tokens (the rollout generation budget)")
        lengths = mask.float().sum(-1) if lengths is None else lengths
        shaped = shaped + adv.overlong_penalty(lengths, max_tokens, algo.overlong_buffer, algo.overlong_penalty)
    if algo.kl_in_reward and algo.kl_coef > 0:
        if old_logprobs is None or ref_logprobs is None:
            raise ValueError("algorithm.kl_in_reward needs old_logprobs and ref_logprobs to fold the KL into the reward")
        kl = losses.kl_estimate(old_logprobs.detach(), ref_logprobs.detach(), algo.kl_estimator)
        return adv.token_rewards(shaped, mask, kl, algo.kl_coef)
    return shaped


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
    if rewards.dim() not in (1, 2) or rewards.shape[0] != mask.shape[0] or (rewards.dim() == 2 and rewards.shape != mask.shape):
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
