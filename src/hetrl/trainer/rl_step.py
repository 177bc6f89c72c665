"""One step's training on the trainer ranks: from a list of rewarded samples to updated models.

Every trainer rank calls :func:`train_on_batch` with the step's full sample list. The rewards
become advantages here, from tensors, because only the trainer has what some estimators need:
the reference log-probs of a KL folded into the reward, and PPO's values. The order:

1. the batch is split into ``num_minibatches`` contiguous minibatches (whole groups when the
   orchestrator's batch is whole groups in order), each sharded over data-parallel ranks;
2. log-probs of the policy the step starts from (and of the reference, and the critic's values)
   for every minibatch, before any update: PPO's ratio and clipping compare against them;
3. rewards shaped (DAPO overlong term, KL in the reward) and advantages estimated on the whole
   batch (group statistics see every group whole; PPO whitens over the batch), plus the value
   targets for the critic;
4. one policy (and critic) optimizer step per minibatch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from hetrl.control import timeline
from hetrl.monitor import names
from hetrl.records import Sample
from hetrl.trainer.algorithms import advantage_metrics, compute_advantages, compute_value_targets, shape_rewards
from hetrl.trainer.batch import completion_tensors
from hetrl.trainer.critic import ValueTrainer
from hetrl.trainer.policy import PolicyTrainer


def minibatch_bounds(num_samples: int, num_minibatches: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of each contiguous minibatch of a step's samples."""
    if num_minibatches > num_samples:
        raise ValueError(f"trainer.updates_per_batch={num_minibatches} exceeds the {num_samples} samples of a step")
    edges = [num_samples * k // num_minibatches for k in range(num_minibatches + 1)]
    return list(zip(edges, edges[1:]))


def _stack(parts: Sequence[Tensor], width: int) -> Tensor:
    """Minibatch sample-space tensors ``[n_k, Tc_k]`` -> one ``[N, width]``, rows in order."""
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts])


def train_on_batch(
    policy: PolicyTrainer,
    critic: ValueTrainer | None,
    samples: list[Sample],
    *,
    num_minibatches: int,
    max_tokens: int,
    supervised: bool = False,
    progress: Callable[[], None] = lambda: None,
) -> tuple[dict[str, float], Tensor]:
    """Train on one step's samples; ``(metrics averaged over the minibatches, trainer log-probs [N, Tc])``.

    The log-probs are the policy's before the update, for the engine-vs-trainer mismatch. With
    ``supervised`` (warm start) every policy token's advantage is 1 and the critic is not trained.
    ``max_tokens`` is the generation budget the overlong penalty ramps to. ``progress`` is called
    after each forward pass and update (the liveness beacon's tick).
    """
    algo = policy.algo_cfg
    bounds = minibatch_bounds(len(samples), num_minibatches)
    with timeline.span("make batch"):
        batches = [policy.make_batch(samples[a:b]) for a, b in bounds]
    mask, _ = completion_tensors(samples)
    width = mask.shape[1]
    # One update on the batch, and nothing needs the old log-probs before it: they come from the
    # update's own forward (policy.train_step), which saves a forward pass per step.
    old_from_update = num_minibatches == 1 and not (algo.kl_in_reward and algo.kl_coef > 0)
    with timeline.span("log-probs"):
        old = None if old_from_update else [policy.compute_logprobs(batch) for batch in batches]
        ref = (
            [policy.compute_logprobs(batch, reference=True) for batch in batches]
            if policy.reference is not None and not supervised
            else None
        )
        values = [critic.compute_values(batch) for batch in batches] if critic is not None and not supervised else None
    progress()
    old_full = None if old is None else _stack(old, width)
    reward_metrics: dict[str, float] = {}
    if supervised:
        advantages, returns = mask, None
    else:
        scores = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        rewards, reward_metrics = shape_rewards(
            algo,
            scores,
            mask,
            old_logprobs=old_full,
            ref_logprobs=None if ref is None else _stack(ref, width),
            max_tokens=max_tokens,
        )
        values_full = None if values is None else _stack(values, width)
        advantages = compute_advantages(algo, rewards, [s.group_id for s in samples], mask, values=values_full)
        returns = None if values_full is None else compute_value_targets(algo, rewards, mask, values_full)
    per_step = []
    for k, (a, b) in enumerate(bounds):
        batch = batches[k].with_advantages(advantages[a:b])
        ref_k = None if ref is None else ref[k]
        if old is None:
            metrics, old_full = policy.train_step(batch, ref_logprobs=ref_k, with_logprobs=True)
            old_full = _stack([old_full], width)
        else:
            metrics = policy.train_step(batch, old_logprobs=old[k], ref_logprobs=ref_k)
        if critic is not None and values is not None and returns is not None:
            metrics.update(critic.train_step(batch, old_values=values[k], returns=returns[a:b]))
        per_step.append(metrics)
        progress()
    metrics = {key: sum(m[key] for m in per_step) / len(per_step) for key in per_step[0]}
    if not supervised:
        metrics.update(advantage_metrics(advantages, mask), **reward_metrics)
    if policy.routing is not None and (disagree := policy.routing.take_disagreement()) is not None:
        metrics[names.ROUTING_DISAGREE_FRAC] = disagree
    return metrics, old_full
