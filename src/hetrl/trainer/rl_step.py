"""One step's training on the trainer ranks: from rewarded samples to updated models.

Every trainer rank calls :func:`train_on_batch` with the step's metadata (a few scalars per sample,
:class:`hetrl.records.SampleMeta`) and its data-parallel replica's shard of the samples; the
step's sample-space tensors ``[N, Tc]`` (loss masks, old/reference log-probs, values, advantages) are
assembled on every rank from the replicas' shards by all-reduces over the data-parallel group. The rewards
become advantages here, from tensors, because only the trainer has what some estimators need:
the reference log-probs of a KL folded into the reward, and PPO's values. The order:

1. the batch is split into ``num_minibatches`` contiguous minibatches (whole groups when the
   orchestrator's batch is whole groups in order), each dealt over data-parallel replicas
   (:mod:`hetrl.trainer.shards`, which the orchestrator can run without torch);
2. log-probs of the policy the step starts from (and of the reference, and the critic's values)
   for every minibatch, before any update: PPO's ratio and clipping compare against them;
3. rewards shaped (DAPO overlong term, KL in the reward) and advantages estimated on the whole
   batch (group statistics see every group whole; PPO whitens over the batch), plus the value
   targets for the critic;
4. one policy (and critic) optimizer step per minibatch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from hetrl.control import timeline
from hetrl.monitor import names
from hetrl.monitor.mismatch import MismatchTotals, mismatch_totals
from hetrl.records import Sample, SampleMeta
from hetrl.trainer.algorithms import advantage_metrics, compute_advantages, compute_value_targets, shape_rewards
from hetrl.trainer.batch import TrainBatch
from hetrl.trainer.critic import ValueTrainer
from hetrl.trainer.parallel import ParallelGroups
from hetrl.trainer.policy import PolicyTrainer
from hetrl.trainer.shards import minibatch_bounds, shard_indices, step_shard


def _stack(parts: Sequence[Tensor], width: int) -> Tensor:
    """Minibatch sample-space tensors ``[n_k, Tc_k]`` -> one ``[N, width]``, rows in order."""
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts])


def replica_shard(policy: PolicyTrainer, metas: Sequence[SampleMeta], num_minibatches: int) -> list[int]:
    """Indices (into the step) of the samples this rank's data-parallel replica trains on."""
    g = policy.groups
    shared = policy.trainer_cfg.shared_prompts
    return step_shard(metas, num_minibatches, g.dp_rank, g.dp_size, tokens_per_image(policy), shared)


def tokens_per_image(policy: PolicyTrainer) -> int | None:
    """Model positions per image (what the shard functions need to weigh a sample); None for a text model."""
    return None if policy.images is None else policy.images.tokens_per_image


def _minibatch(
    policy: PolicyTrainer, metas: Sequence[SampleMeta], shard: Mapping[int, Sample], a: int, b: int
) -> TrainBatch:
    """This replica's :class:`TrainBatch` of the minibatch ``[a, b)`` of the step."""
    g = policy.groups
    mine = shard_indices(metas[a:b], g.dp_rank, g.dp_size, tokens_per_image(policy), policy.trainer_cfg.shared_prompts)
    if missing := [a + i for i in mine if a + i not in shard]:
        raise ValueError(f"data-parallel rank {g.dp_rank} lacks samples {missing[:8]} of its shard of the step")
    return policy.make_batch([shard[a + i] for i in mine], mine, b - a)


def _step_mask(
    metas: Sequence[SampleMeta], shard: Mapping[int, Sample], rows: list[int], groups: ParallelGroups
) -> Tensor:
    """The step's loss masks ``[N, Tc]`` in sample space, on every rank: each replica fills its own
    ``rows`` and the data-parallel all-reduce adds them up (each row is one replica's)."""
    width = max((m.completion_len for m in metas), default=0)
    mask = torch.zeros(len(metas), max(width, 1), dtype=torch.uint8)  # 0/1: a quarter of float32's bytes
    for i in rows:
        mask[i, : metas[i].completion_len] = torch.tensor(shard[i].loss_mask, dtype=torch.uint8)
    if groups.dp_size > 1:
        mask = mask.to(groups.device)  # NCCL reduces device tensors only
        dist.all_reduce(mask, group=groups.dp)
    return mask.float().cpu()


def train_on_batch(
    policy: PolicyTrainer,
    critic: ValueTrainer | None,
    metas: Sequence[SampleMeta],
    shard: Mapping[int, Sample],
    *,
    num_minibatches: int,
    max_tokens: int,
    supervised: bool = False,
    progress: Callable[[], None] = lambda: None,
) -> tuple[dict[str, float], dict[int, Tensor]]:
    """Train on one step; ``(metrics averaged over the minibatches, trainer log-probs of the replica's samples)``.

    ``metas`` describe every sample of the step, in order; ``shard`` holds the samples this rank's
    data-parallel replica trains on (at least :func:`replica_shard`'s), by their index in the step.
    The log-probs are the policy's before the update, ``{step index: [completion_len] float32}`` for each
    sample of the replica's shard (what the rollout store keeps). An RL step's metrics include the
    engine-vs-trainer mismatch of the whole step (:func:`_mismatch`). With ``supervised`` (warm start)
    every policy token's advantage is 1 and the critic is not trained.
    ``max_tokens`` is the generation budget the overlong penalty ramps to. ``progress`` is called
    after each forward pass and update (the liveness beacon's tick).
    """
    algo = policy.algo_cfg
    bounds = minibatch_bounds(len(metas), num_minibatches)
    with timeline.span("make batch"):
        batches = [_minibatch(policy, metas, shard, a, b) for a, b in bounds]
    rows = [a + i for (a, _), batch in zip(bounds, batches) for i in batch.global_indices]
    mask = _step_mask(metas, shard, rows, policy.groups)
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
        scores = torch.tensor([m.reward for m in metas], dtype=torch.float32)
        rewards, reward_metrics = shape_rewards(
            algo,
            scores,
            mask,
            old_logprobs=old_full,
            ref_logprobs=None if ref is None else _stack(ref, width),
            max_tokens=max_tokens,
        )
        values_full = None if values is None else _stack(values, width)
        advantages = compute_advantages(algo, rewards, [m.group_id for m in metas], mask, values=values_full)
        returns = None if values_full is None else compute_value_targets(algo, rewards, mask, values_full)
    per_step = []
    before: dict[int, Tensor] = {} if old_full is None else {i: old_full[i] for i in rows}
    for k, (a, b) in enumerate(bounds):
        batch = batches[k].with_advantages(advantages[a:b])
        ref_k = None if ref is None else ref[k]
        if old is None:
            metrics, local = policy.train_step(batch, ref_logprobs=ref_k, with_logprobs=True)
            before = {a + i: local[r] for r, i in enumerate(batch.global_indices)}
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
    logprobs = {i: before[i][: metas[i].completion_len].clone() for i in rows}
    if not supervised:
        metrics.update(_mismatch(shard, logprobs, policy.groups))
    return metrics, logprobs


def _mismatch(shard: Mapping[int, Sample], logprobs: Mapping[int, Tensor], groups: ParallelGroups) -> dict[str, float]:
    """The step's engine-vs-trainer mismatch (:mod:`hetrl.monitor.mismatch`) on every rank: each replica's
    totals over its own samples, added up (maxima maxed) over the data-parallel group, where each replica has
    one rank; equal to the metrics of the whole batch, without gathering any log-prob."""
    rows = sorted(logprobs)
    mine = mismatch_totals(
        [shard[i].logprobs for i in rows], [logprobs[i].tolist() for i in rows], [shard[i].loss_mask for i in rows]
    )
    if groups.dp_size == 1:
        return mine.metrics()
    sums = torch.tensor([mine.num_tokens, mine.ratio_sum, mine.k3_sum], dtype=torch.float64, device=groups.device)
    top = torch.tensor([mine.max_abs_log_ratio], dtype=torch.float64, device=groups.device)
    dist.all_reduce(sums, group=groups.dp)
    dist.all_reduce(top, op=dist.ReduceOp.MAX, group=groups.dp)
    num_tokens, ratio_sum, k3_sum = sums.tolist()
    return MismatchTotals(int(num_tokens), ratio_sum, k3_sum, float(top)).metrics()
