"""``PolicyTrainer``: the trainer role's model, reference model, optimizer and one training step.

Ownership across processes: every trainer rank builds one ``PolicyTrainer`` and trains on its
data-parallel replica's shard of a step (:meth:`PolicyTrainer.make_batch`); results that the loop
reads (log-probs, metrics) are returned whole on every rank. Tensors the loop passes in or gets
back are in *sample space* ``[N, Tc]`` over the step's full batch (see ``hetrl.trainer.batch``), the layout of
``hetrl.trainer.algorithms.compute_advantages``.

Loss scaling, so that micro-batches and ranks add up to one big batch: ``compute_loss`` is given
the step's global token/sequence counts, making each micro-batch loss its share of the step loss.
Megatron's schedule divides every returned loss by the number of micro-batches ``M`` and its DDP
averages gradients over the ``D`` data-parallel ranks, so the loss handed to megatron is that share
times ``M * D``; gradients are then exactly those of the summed loss.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import Tensor

from hetrl.config.algorithm import AlgorithmConfig
from hetrl.config.model import ModelConfig
from hetrl.config.rollout import ROUTING_WITH_RECOMPUTE
from hetrl.config.trainer import TrainerConfig
from hetrl.control import timeline
from hetrl.monitor import names
from hetrl.records import Sample, SampleMeta
from hetrl.trainer import losses
from hetrl.trainer.algorithms import LossInputs, compute_loss
from hetrl.trainer.batch import MicroBatch, TrainBatch, build_train_batch
from hetrl.trainer.logprobs import broadcast_from_last_stage, forward_logprobs, run_schedule, sample_logprobs
from hetrl.trainer.model import build_gpt_model
from hetrl.trainer.optim import build_optimizer, wrap_ddp
from hetrl.trainer.parallel import ParallelGroups, init_parallel
from hetrl.trainer.routing_replay import RoutingReplay
from hetrl.trainer.shards import shard_indices
from hetrl.trainer.vision import image_spec

RoutingMode = Literal["off", "measure", "replay"]

TOKENS_PER_S = "perf/trainer_tokens_per_s"  # trained tokens (prompt + completion, all DP ranks) per second
STEP_TIME_S = "perf/train_step_s"


class PolicyTrainer:
    """The policy (megatron ``GPTModel`` in DDP), its optimizer/LR schedule, and a frozen reference.

    ``total_steps`` sizes the LR decay (when ``trainer.lr_decay_steps`` is unset); ``temperature``
    is the engines' sampling temperature (log-probs are of ``softmax(z / T)``); ``max_len`` is the
    generation budget the Dr.GRPO aggregation divides by; ``with_reference`` builds the frozen
    reference model (default: when ``algorithm.kl_coef > 0``). ``routing`` says what the policy's
    MoE routers do with the engine routing the samples carry (:mod:`hetrl.trainer.routing_replay`):
    nothing, compare their own with it, or replay it.
    """

    def __init__(
        self,
        model_cfg: ModelConfig,
        trainer_cfg: TrainerConfig,
        algo_cfg: AlgorithmConfig,
        *,
        groups: ParallelGroups | None = None,
        seed: int = 1234,
        total_steps: int | None = None,
        temperature: float = 1.0,
        max_len: int | None = None,
        with_reference: bool | None = None,
        routing: RoutingMode = "off",
    ) -> None:
        self.model_cfg, self.trainer_cfg, self.algo_cfg = model_cfg, trainer_cfg, algo_cfg
        self.images = image_spec(
            model_cfg
        )  # None for a text model; the placeholder id may come from the checkpoint's config
        self.groups = groups or init_parallel(trainer_cfg)
        self.temperature, self.max_len = temperature, max_len
        module = build_gpt_model(model_cfg, trainer_cfg, pg_collection=self.groups.pg_collection, seed=seed)
        if routing != "off" and trainer_cfg.recompute_activations and trainer_cfg.pipeline_parallel > 1:
            raise ValueError(ROUTING_WITH_RECOMPUTE)
        # MoE routing of the engine: compared with the trainer's own ("measure") or replayed ("replay").
        self.routing = (
            None
            if routing == "off"
            else RoutingReplay(module, self.groups, replay=routing == "replay", num_layers=model_cfg.num_layers)
        )
        self.model = wrap_ddp(module, trainer_cfg, self.groups.pg_collection)
        self.optimizer, self.scheduler = build_optimizer(
            self.model, trainer_cfg, total_steps=total_steps, pg_collection=self.groups.pg_collection
        )
        self.reference: torch.nn.Module | None = None
        if with_reference if with_reference is not None else algo_cfg.kl_coef > 0:
            self.reference = build_gpt_model(model_cfg, trainer_cfg, pg_collection=self.groups.pg_collection, seed=seed)
            self.reference.requires_grad_(False).eval()
            self.sync_reference()
        self.step = 0

    def reset_optimizer(self, total_steps: int | None, trainer_cfg: TrainerConfig | None = None) -> None:
        """A fresh optimizer and LR schedule for a new training stage (RL after a supervised warm start).

        Adam's second moments remember ~1/(1 - beta2) steps of squared gradients: carried over from
        likelihood training, whose gradients are orders of magnitude larger than policy-gradient
        ones, they would shrink every RL update to almost nothing. ``trainer_cfg`` (default: the
        current one) gives the stage its own learning rate and schedule.
        """
        self.trainer_cfg = trainer_cfg or self.trainer_cfg
        self.optimizer, self.scheduler = build_optimizer(
            self.model, self.trainer_cfg, total_steps=total_steps, pg_collection=self.groups.pg_collection
        )

    @property
    def module(self) -> torch.nn.Module:
        """The unwrapped ``GPTModel`` of this rank (what checkpoints and weight export read)."""
        return self.model.module

    def sync_reference(self) -> None:
        """Make the reference model a copy of the current policy (e.g. after loading HF weights)."""
        if self.reference is None:
            raise RuntimeError("this PolicyTrainer has no reference model (with_reference=False)")
        self.reference.load_state_dict(self.module.state_dict())

    def make_batch(
        self, samples: Sequence[Sample], indices: Sequence[int] | None = None, num_global: int | None = None
    ) -> TrainBatch:
        """This rank's micro-batches of one step's (or minibatch's) samples.

        ``samples`` are this data-parallel replica's shard, at positions ``indices`` of the step's
        ``num_global`` samples (dealt by :func:`hetrl.trainer.shards.shard_indices`, which the
        orchestrator runs too); without ``indices``, the whole list (identical on every rank), sharded
        here. Advantages are zero; a training step attaches those of the full list with
        :meth:`TrainBatch.with_advantages`. Every rank gets the same number of micro-batches (filler
        ones where a shard is short): expert all-to-alls and the gradient reduction need every rank
        in step. A vision-language policy's samples carry their images (``Sample.images``, one
        placeholder id each); sample space stays that of the samples.
        """
        g = self.groups
        images = self.images
        shared = self.trainer_cfg.shared_prompts
        if indices is None:
            tokens_per_image = None if images is None else images.tokens_per_image
            metas = [SampleMeta.of(s) for s in samples]
            indices = shard_indices(metas, g.dp_rank, g.dp_size, tokens_per_image, shared_prompts=shared)
            samples, num_global = [samples[i] for i in indices], len(samples)
        batch = build_train_batch(
            samples,
            micro_batch_size=self.trainer_cfg.micro_batch_size,
            pack_length=self.trainer_cfg.pack_length,
            global_indices=indices,
            num_global_samples=num_global,
            images=images,
            shared_prompts=shared,
        )
        count = torch.tensor([len(batch.micro_batches)])
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return batch.padded_to(int(count))

    def compute_logprobs(
        self, batch: TrainBatch, *, reference: bool = False, with_entropy: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Sample-space log-probs ``[N, Tc]`` of the full batch under the policy (or the reference).

        With ``with_entropy`` returns ``(logprobs, entropy)``.
        """
        model = self.reference if reference else self.model
        if model is None:
            raise RuntimeError(
                "compute_logprobs(reference=True) needs a reference model (with_reference=True or algorithm.kl_coef > "
                "0)"
            )
        routing = None if reference else self.routing
        with routing.measuring() if routing is not None else nullcontext():
            logprobs, entropy = forward_logprobs(
                model, batch, self.groups, temperature=self.temperature, with_entropy=with_entropy, routing=routing
            )
        if with_entropy:
            return to_global(logprobs, batch, self.groups), to_global(entropy, batch, self.groups)
        return to_global(logprobs, batch, self.groups)

    def train_step(
        self,
        batch: TrainBatch,
        *,
        old_logprobs: Tensor | None = None,
        ref_logprobs: Tensor | None = None,
        with_logprobs: bool = False,
    ) -> dict[str, float] | tuple[dict[str, float], Tensor]:
        """One optimizer step on the batch (all its micro-batches accumulated); the step's metrics.

        ``old_logprobs`` (full batch, sample space) default to the policy's own before this update,
        taken from the update's own forward, detached: the first update on a batch needs no forward
        of its own for them (no dropout, so they equal a separate pass's). ``ref_logprobs`` default
        to the reference model's when there is one. Metrics: the loss parts and clip fractions of
        ``compute_loss`` summed over the whole step, ``grad_norm`` (before clipping), ``lr``,
        tokens/s and step time. ``with_logprobs`` also returns the update forward's log-probs (the
        weights before the update) of this replica's samples, ``[n, Tc]`` in batch order (row ``r`` is the
        sample at ``batch.global_indices[r]``): no data-parallel collective gathers the others'.
        """
        start = time.perf_counter()
        if ref_logprobs is None and self.reference is not None:
            ref_logprobs = self.compute_logprobs(batch, reference=True)
        num_tokens, num_seqs = global_counts(batch, self.groups)
        local_old = None if old_logprobs is None else old_logprobs[batch.global_indices]
        local_ref = None if ref_logprobs is None else ref_logprobs[batch.global_indices]
        # Megatron's schedule divides each micro-batch loss by M (and multiplies it by CP, which
        # DDP's average over DP x CP cancels): that holds for a (loss, metrics) pair, as below.
        scale = len(batch.micro_batches) * self.groups.dp_size
        need_entropy = self.algo_cfg.entropy_coef > 0

        def loss_func(mb: MicroBatch, logits: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            lp, ent = sample_logprobs(logits, mb, self.groups, temperature=self.temperature, with_entropy=need_entropy)
            update_logprobs.append(lp.detach())
            mask = mb.loss_mask.to(lp.device)
            inputs = LossInputs(
                logprobs=lp,
                old_logprobs=update_logprobs[-1] if local_old is None else batch.gather(local_old, mb),
                advantages=mb.advantages.to(lp.device),
                mask=mask,
                rollout_logprobs=mb.rollout_logprobs.to(lp.device),
                ref_logprobs=None if local_ref is None else batch.gather(local_ref, mb),
                entropy=ent,
            )
            loss, metrics = compute_loss(
                self.algo_cfg, inputs, num_global_tokens=num_tokens, num_global_seqs=num_seqs, max_len=self.max_len
            )
            return loss * scale, {k: v.detach().float() for k, v in metrics.items()}

        update_logprobs: list[Tensor] = []  # per micro-batch, on the last pipeline stage
        self.optimizer.zero_grad()
        self.model.zero_grad_buffer()
        # The update's forward is of the weights the engine sampled with when it yields the old log-probs.
        measure = self.routing is not None and old_logprobs is None
        with timeline.span("forward-backward"), self.routing.measuring() if measure else nullcontext():
            stored = run_schedule(self.model, batch, self.groups, loss_func, forward_only=False, routing=self.routing)
        self.scheduler.step(
            increment=1
        )  # before the update: step k uses the schedule's LR at k (warmup starts above 0)
        with timeline.span("optimizer step"):
            _, grad_norm, _ = self.optimizer.step()
        self.step += 1
        metrics = reduce_metrics(stored, self.groups)
        elapsed = time.perf_counter() - start
        total_tokens = torch.tensor([float(batch.num_tokens)])
        if self.groups.dp_size > 1:
            dist.all_reduce(total_tokens, group=self.groups.dp)
        metrics.update(
            {
                names.GRAD_NORM: float(grad_norm) if grad_norm is not None else 0.0,
                names.LEARNING_RATE: float(self.optimizer.param_groups[0]["lr"]),
                TOKENS_PER_S: float(total_tokens) / elapsed,
                STEP_TIME_S: elapsed,
            }
        )
        if not with_logprobs:
            return metrics
        last = self.groups.is_last_stage
        return metrics, broadcast_from_last_stage(
            batch.scatter(update_logprobs) if last else None, (batch.num_samples, batch.max_completion_len), self.groups
        )


def to_global(local: Tensor, batch: TrainBatch, groups: ParallelGroups) -> Tensor:
    """A sample-space tensor of this rank's shard -> the full batch's, on every rank (on the CPU; the all-reduces run
    on the data-parallel group's device, since NCCL reduces device tensors only)."""
    out = torch.zeros(batch.num_global_samples, local.shape[1])
    out[batch.global_indices] = local
    if groups.dp_size > 1:
        width = torch.tensor([out.shape[1]], device=groups.device)
        dist.all_reduce(width, op=dist.ReduceOp.MAX, group=groups.dp)
        out = torch.nn.functional.pad(out, (0, int(width) - out.shape[1])).to(groups.device)
        dist.all_reduce(out, group=groups.dp)
    return out.cpu()


def global_counts(batch: TrainBatch, groups: ParallelGroups) -> tuple[Tensor, Tensor]:
    """The step's policy tokens and sequences over all DP ranks (the loss normalisers)."""
    counts = torch.tensor([losses.count_tokens_and_seqs(mb.loss_mask) for mb in batch.micro_batches]).sum(0)
    if groups.dp_size > 1:
        dist.all_reduce(counts, group=groups.dp)
    return counts[0], counts[1]


def reduce_metrics(stored: list[dict[str, Tensor]], groups: ParallelGroups) -> dict[str, float]:
    """Sum the per-micro-batch metric shares over micro-batches and DP ranks; same dict on every rank."""
    result: list[Any] = [None]
    if groups.is_last_stage:
        keys = sorted(stored[0])
        totals = torch.stack([sum(d[k].cpu() for d in stored) for k in keys])
        if groups.dp_size > 1:
            dist.all_reduce(totals, group=groups.dp)
        result = [dict(zip(keys, totals.tolist()))]
    if groups.pp_size > 1:
        dist.broadcast_object_list(result, src=dist.get_global_rank(groups.pp, groups.pp_size - 1), group=groups.pp)
    return result[0]
