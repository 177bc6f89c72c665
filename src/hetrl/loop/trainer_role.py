"""The trainer role: trainer rank 0 (the leader) takes each message from the orchestrator and shares
it with the other trainer ranks; each data-parallel replica receives its own shard of a step's samples
and trains on it; the leader streams the new weights to the engines.

Ownership: the policy's weights (and PPO's value model) live here. The orchestrator sends each
message once, to the leader, whatever the number of trainer ranks; the leader broadcasts it to the
trainer ranks over their MPI communicator (``hetrl.control.comm.share``: a tree, polled from Python).
A step's message (:class:`TrainWork`) carries metadata only; payloads never cross the orchestrator
(the data plane, ``hetrl.control.protocol``). At start the trainer ranks find their replicas (megatron
dealt them; :func:`find_replica`) and the leader tells the orchestrator where each replica receives
(:class:`TrainerLayout`: its lowest trainer rank). For each step that receiver takes the replica's samples,
and only those, from the :class:`TrainShard` messages of their holders (``Tag.SHARD``: the engines that
generated them; the orchestrator for warm-start demonstrations), shares them with the replica's other
ranks, and after training appends the replica's RL samples, with the trainer's log-probs, to its own part
of the rollout store (``RUN/rollouts``, one writer per file). The engine-vs-trainer mismatch is measured
here too, where both log-probs are (``hetrl.trainer.rl_step``).
The trainer turns the step's rewards into advantages itself (``hetrl.trainer.rl_step``), because
the reference log-probs of a KL in the reward and PPO's values exist only here. After each optimizer
step, the leader reports the new version to the orchestrator and then pushes the weights in HF
layout, bucket by bucket, from the streaming exporter (every trainer rank takes part in the
exporter's gathers); the engines join the push when the orchestrator tells them to. Warm-start
(``supervised``) steps use plain token-mean likelihood: no ratio, no clipping, no IS correction.

Waits: the leader's receive, a receiver's wait for its shard and every rank's broadcast poll MPI (none
blocks inside MPI); the liveness watchdog bounds them, as every other wait of an idle rank.

Each :class:`TrainDone` also carries this rank's share of the step's time breakdown, measured
here because only here is it visible: ``time/wait`` (idle, waiting for work, since the previous
answer), ``time/weight_sync`` (the latest weight push, which follows the previous answer) and, on a
known GPU, ``perf/mfu``.

Checkpoints (``RUN_DIR/checkpoints/step_<version>``) hold model, optimizer, LR schedule (and PPO's
value model with its own), RNG and
the orchestrator's loop state, saved when the orchestrator sends :class:`Checkpoint`. On
:class:`Restore` the trainer loads one and pushes its weights like a step's: the engines start from
the initial HF checkpoint at version 0, so this push is what makes them serve the resumed version.
On :class:`PushWeights` (an engine refused the last push) it pushes the same weights again.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hetrl.config.schema import HetrlConfig
from hetrl.control import liveness, timeline
from hetrl.control.comm import RoleContext, Tag, flush_sends, naps, poll, recv, send, share
from hetrl.control.protocol import (
    Checkpoint,
    CheckpointDone,
    PushFailed,
    PushWeights,
    Restore,
    Restored,
    Shutdown,
    TrainDone,
    TrainerLayout,
    TrainShard,
    TrainWork,
)
from hetrl.control.rendezvous import free_port
from hetrl.control.role_loop import Handler, RoleLoop
from hetrl.control.rundir import checkpoint_root
from hetrl.loop import faults
from hetrl.loop.faults import RankFaults
from hetrl.monitor import names
from hetrl.monitor.mfu import MfuMeter
from hetrl.monitor.rollout_store import ROLLOUT_DIR, RolloutStore
from hetrl.records import Sample, SampleMeta
from hetrl.trainer.checkpoint import load_checkpoint, save_checkpoint, start_checkpoint_writer
from hetrl.trainer.critic import ValueTrainer
from hetrl.trainer.exporter import iter_hf_weight_buckets
from hetrl.trainer.hf_convert import load_hf_checkpoint
from hetrl.trainer.policy import PolicyTrainer
from hetrl.trainer.rl_step import replica_shard, tokens_per_image, train_on_batch
from hetrl.transport.weights import WeightStreamBroken

logger = logging.getLogger(__name__)


def _supervised_algorithm(cfg: HetrlConfig):
    """GRPO's loss at ratio 1 with advantage 1 is exactly the token-mean NLL gradient."""
    return cfg.algorithm.model_copy(
        update={
            "name": "grpo",
            "is_correction": "none",
            "kl_coef": 0.0,
            "entropy_coef": 0.0,
            "loss_aggregation": "token-mean",
        }
    )


def init_trainer_world(ctx: RoleContext) -> None:
    """torch.distributed over the trainer ranks only (Megatron's default group), rendezvous via MPI."""
    import socket

    import torch
    import torch.distributed as dist

    address = (socket.gethostname(), free_port()) if ctx.role_comm.Get_rank() == 0 else None
    host, port = ctx.role_comm.bcast(address, root=0)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(
        backend, init_method=f"tcp://{host}:{port}", rank=ctx.role_comm.Get_rank(), world_size=ctx.role_comm.Get_size()
    )


def _next_message(ctx: RoleContext) -> Any:
    """The orchestrator's next message on every trainer rank: the leader receives it, then shares it."""
    message = recv(ctx.world, ctx.orchestrator_rank, Tag.WORK)[0] if ctx.role_comm.Get_rank() == 0 else None
    return share(ctx.role_comm, message) if ctx.role_comm.Get_size() > 1 else message


@dataclass
class Replica:
    """This trainer rank's data-parallel replica: its ranks, and where every replica receives its shards."""

    dp_rank: int
    receivers: list[int]  # world rank of each replica's receiver (its lowest trainer rank), by data-parallel rank
    comm: Any  # this replica's trainer ranks (MPI), in trainer rank order: the receiver is rank 0

    @property
    def is_receiver(self) -> bool:
        return self.comm.Get_rank() == 0


def find_replica(ctx: RoleContext, dp_rank: int) -> Replica:
    """Every trainer rank's replica as megatron dealt them (each rank says its own data-parallel rank: megatron's
    rank order is not computed twice). Collective over the trainer ranks."""
    ranks = ctx.role_comm.allgather((dp_rank, ctx.rank))
    dp_size = max(dp for dp, _ in ranks) + 1
    receivers = [min(world for dp, world in ranks if dp == k) for k in range(dp_size)]
    comm = ctx.role_comm.Split(color=dp_rank, key=ctx.role_comm.Get_rank())
    assert (comm.Get_rank() == 0) == (receivers[dp_rank] == ctx.rank), (ranks, comm.Get_rank())
    return Replica(dp_rank, receivers, comm)


def receive_shard(
    world: Any, step: int, metas: Sequence[SampleMeta], wanted: Sequence[int], holders: str
) -> dict[int, Sample]:
    """The samples ``wanted`` (their indices in the step) of ``step``, by index, from the :class:`TrainShard`
    messages their holders send (``Tag.SHARD``, any sender, any number of messages each).

    A shard of another step, or a sample not wanted or received twice, is an error naming its sender: the
    orchestrator ships each sample of a step once, to the replica that trains on it, and the next step's only
    after this one's answer. The wait polls under the liveness watchdog (idle: it waits on ``holders``; each part
    that arrives is progress).
    """
    index = {metas[i].sample_id: i for i in wanted}
    shard: dict[int, Sample] = {}
    pauses = naps()
    while len(shard) < len(index):
        liveness.idle(f"waiting for the shard of step {step}: {len(index) - len(shard)} samples from {holders}")
        got = poll(world, tag=Tag.SHARD)
        if got is None:
            time.sleep(next(pauses))
            continue
        message, source, _ = got
        if not isinstance(message, TrainShard) or message.step != step:
            what = f"step {message.step}'s shard" if isinstance(message, TrainShard) else type(message).__name__
            raise RuntimeError(f"world rank {source} sent {what} while this replica waits for step {step}'s")
        for sample in message.samples:
            i = index.get(sample.sample_id)
            if i is None or i in shard:
                why = "a second time" if i is not None else "which this replica does not train on"
                raise RuntimeError(f"world rank {source} sent sample {sample.sample_id} of step {step} {why}")
            shard[i] = sample
    return shard


def _store_step(store: RolloutStore, step: int, shard: dict[int, Sample], logprobs: dict[int, Any]) -> None:
    """The replica's samples of an RL step (their holders gave them their verdicts) with the trainer's log-probs,
    written before the step is answered: a guard that stops the run on this step ends every rank at once, and the
    evidence must be on disk by then."""
    rows = sorted(logprobs)
    store.append(step, [shard[i] for i in rows], [logprobs[i].numpy() for i in rows])
    store.flush()


def _open_store(cfg: HetrlConfig, run_dir: Path, replica: Replica) -> RolloutStore | None:
    """The replica receiver's part of the rollout store (one writer per file: one name per replica)."""
    store_cfg = cfg.monitor.rollout_store
    if not (store_cfg.enabled and replica.is_receiver):
        return None
    name = "rollouts" if len(replica.receivers) == 1 else f"rollouts-dp{replica.dp_rank}"
    return RolloutStore(
        run_dir / ROLLOUT_DIR, name=name, flush_every=store_cfg.flush_every, compression=store_cfg.compression
    )


def run_trainer(
    ctx: RoleContext, cfg: HetrlConfig, run_dir: Path, model_dir: Path, sender: Any | None, rank_faults: RankFaults
) -> None:
    import torch

    init_trainer_world(ctx)
    start_checkpoint_writer()  # now, so that a pre-emption signal cannot kill its helper mid-start
    torch.manual_seed(cfg.run.seed)
    total_steps = cfg.run.steps + cfg.warm_start.steps
    trainer = PolicyTrainer(
        cfg.model,
        cfg.trainer,
        cfg.algorithm,
        seed=cfg.run.seed,
        total_steps=total_steps,
        temperature=cfg.rollout.temperature,
        max_len=cfg.rollout.max_tokens,
        routing="replay" if cfg.rollout.routing_replay else "measure" if cfg.rollout.return_routing else "off",
    )
    liveness.tick()
    load_hf_checkpoint(trainer.module, model_dir, trainer.groups.pg_collection)
    if trainer.reference is not None:
        trainer.sync_reference()  # the reference is the initial policy, also after a resume
    critic = None
    if cfg.algorithm.name == "ppo":
        critic = ValueTrainer(
            cfg.model,
            cfg.trainer,
            cfg.critic,
            cfg.algorithm,
            trainer.groups,
            seed=cfg.run.seed,
            total_steps=cfg.run.steps * cfg.trainer.updates_per_batch,
            max_len=cfg.rollout.max_tokens,
        )
        critic.load_initial_weights(cfg.critic.init, model_dir)
        liveness.tick()
    TrainerRank(ctx, cfg, run_dir, trainer, critic, sender, rank_faults).serve()


class TrainerRank:
    """One trainer rank between two messages: what it holds (the version, the optimizer's stage, the clock, the
    rigged faults) and what it does with each message from the orchestrator (:attr:`loop`'s handler table)."""

    def __init__(
        self,
        ctx: RoleContext,
        cfg: HetrlConfig,
        run_dir: Path,
        trainer: Any,
        critic: Any | None,
        sender: Any | None,
        rank_faults: RankFaults,
    ) -> None:
        self.ctx, self.cfg, self.run_dir, self.sender = ctx, cfg, run_dir, sender
        self.trainer, self.critic = trainer, critic
        self.rl_algorithm, self.sft_algorithm = trainer.algo_cfg, _supervised_algorithm(cfg)
        self.stage_cfg = {
            "rl": cfg.trainer,
            "supervised": cfg.trainer.model_copy(update={"lr": cfg.warm_start.lr, "lr_warmup_steps": 0}),
        }
        self.stage_steps = {"rl": cfg.run.steps * cfg.trainer.updates_per_batch, "supervised": cfg.warm_start.steps}
        self.stage = "rl"  # the optimizer PolicyTrainer built
        self.version = 0
        self.clock = _Clock()
        self.rigged = _RiggedFaults(rank_faults)
        self.mfu = MfuMeter.for_this_process(cfg.model, ctx.role_comm.Get_size(), cfg.trainer.precision)
        self.loop = RoleLoop(ctx, self.handlers())
        self.replica = find_replica(ctx, trainer.groups.dp_rank)
        self.store = _open_store(cfg, run_dir, self.replica)
        layout = TrainerLayout(self.replica.receivers, tokens_per_image(trainer), cfg.trainer.shared_prompts)
        _reply(ctx, sender, layout)  # before any step: the orchestrator deals the shards by it

    def handlers(self) -> dict[type, Handler]:
        """What every trainer rank does with each of the orchestrator's messages."""
        return {
            TrainWork: self._on_train,
            Checkpoint: self._on_checkpoint,
            Restore: self._on_restore,
            PushWeights: self._on_push_weights,
            Shutdown: self._on_shutdown,
        }

    def serve(self) -> None:
        """The orchestrator's messages, one at a time, until Shutdown. The wait is the leader's receive and the
        trainer ranks' share (:func:`_next_message`), not the loop's poll: every rank handles every message. The
        rollout store's part is closed (flushed) on the way out, whatever ends the loop."""
        try:
            while not self.loop.stop:
                liveness.idle("waiting for work from the orchestrator")
                with self.clock.timing("wait"):
                    message = _next_message(self.ctx)
                liveness.busy(_activity(message, self.version))
                self.loop.handle(message, self.ctx.orchestrator_rank)
        finally:
            if self.store is not None:
                self.store.close()

    def _on_shutdown(self, message: Shutdown, source: int) -> None:
        self.loop.stop = True

    def _on_checkpoint(self, message: Checkpoint, source: int) -> None:
        path = _save(self.trainer, self.critic, self.cfg, self.run_dir, message, self.version)
        _reply(self.ctx, self.sender, CheckpointDone(str(path)))

    def _on_restore(self, message: Restore, source: int) -> None:
        self.version, loop_state = _restore(self.trainer, self.critic, message.path)
        # The checkpoint's optimizer and LR schedule belong to the stage it was saved in.
        self.stage = "supervised" if loop_state["loop"]["warm_steps_done"] < self.cfg.warm_start.steps else "rl"
        _reply(self.ctx, self.sender, Restored(self.version, loop_state))
        with self.clock.timing("weight_sync"):
            _push_weights(self.ctx, self.trainer, self.cfg, self.sender, self.version)

    def _on_push_weights(self, message: PushWeights, source: int) -> None:
        """An engine refused the last push: the same weights again."""
        if message.version != self.version:
            raise RuntimeError(
                f"orchestrator asked to push v{message.version} again, the trainer holds v{self.version}"
            )
        with self.clock.timing("weight_sync"):
            _push_weights(self.ctx, self.trainer, self.cfg, self.sender, self.version, message.attempt)

    def _on_train(self, message: TrainWork, source: int) -> None:
        """One step on this replica's shard, the replica's RL samples to its rollout store part, the step's answer (new
        version, metrics), then the weight push."""
        cfg, trainer = self.cfg, self.trainer
        wanted = "supervised" if message.supervised else "rl"
        if wanted != self.stage:  # a new stage: fresh Adam moments and the stage's own LR schedule
            trainer.reset_optimizer(total_steps=self.stage_steps[wanted], trainer_cfg=self.stage_cfg[wanted])
            self.stage = wanted
        trainer.algo_cfg = self.sft_algorithm if message.supervised else self.rl_algorithm
        num_minibatches = 1 if message.supervised else cfg.trainer.updates_per_batch
        metas = self.rigged.metas(message)
        shard = self._receive_shard(message, metas, num_minibatches)
        metrics, logprobs = train_on_batch(
            trainer,
            self.critic,
            metas,
            shard,
            num_minibatches=num_minibatches,
            max_tokens=cfg.rollout.max_tokens,
            supervised=message.supervised,
            progress=liveness.tick,
        )
        train_s = metrics[names.TRAIN_STEP_S] * num_minibatches  # the optimizer steps' wall time
        metrics.update(self.mfu.measure([m.prompt_len + m.completion_len for m in metas], train_s))
        metrics.update(self.clock.take())
        self.version += 1
        if self.store is not None and not message.supervised:  # warm-start demonstrations are not rollouts
            _store_step(self.store, message.step, shard, logprobs)
        _reply(self.ctx, self.sender, TrainDone(message.step, self.version, metrics))
        with self.clock.timing("weight_sync"):
            _push_weights(self.ctx, trainer, cfg, self.sender, self.version)
        self.rigged.after_push(trainer)

    def _receive_shard(self, message: TrainWork, metas: list[SampleMeta], num_minibatches: int) -> dict[int, Sample]:
        """This replica's samples of the step (:func:`replica_shard`), by index, on every rank of the replica: its
        receiver takes them from their holders (:func:`receive_shard`) and shares them over the replica."""
        replica, step = self.replica, message.step
        shard = None
        if replica.is_receiver:
            wanted = replica_shard(self.trainer, metas, num_minibatches)
            holders = "the orchestrator" if message.supervised else "the engines"
            shard = receive_shard(self.ctx.world, step, metas, wanted, holders)
        if replica.comm.Get_size() > 1:
            receiver = replica.receivers[replica.dp_rank]
            if not replica.is_receiver:
                liveness.idle(f"waiting for step {step}'s shard from the replica's receiver (world rank {receiver})")
            shard = share(replica.comm, shard)
        liveness.busy(_activity(message, self.version))
        return shard


def _activity(message: Any, version: int) -> str:
    """What the trainer is doing with ``message``, for the liveness watchdog's report."""
    if isinstance(message, TrainWork):
        return f"{'warm-start' if message.supervised else 'RL'} step {message.step} (v{version} -> v{version + 1})"
    if isinstance(message, Checkpoint):
        return f"saving the checkpoint of v{version}"
    if isinstance(message, Restore):
        return f"restoring {message.path}"
    return f"{type(message).__name__} (holding v{version})"


class _Clock:
    """Seconds per phase (``wait``, ``weight_sync``) since they were last reported."""

    def __init__(self) -> None:
        self._spent: dict[str, float] = {}

    @contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self._spent[phase] = self._spent.get(phase, 0.0) + time.monotonic() - start

    def take(self) -> dict[str, float]:
        """``time/<phase>`` of every phase timed since the previous call (a phase not timed is absent)."""
        spent, self._spent = self._spent, {}
        return {names.time_phase(phase): seconds for phase, seconds in spent.items()}


class _RiggedFaults:
    """The trainer's injected misbehaviours (``nan_loss``, ``desync_weights``, ``drift_weights``: hetrl.loop.faults)."""

    def __init__(self, rank_faults: RankFaults) -> None:
        self.nan = rank_faults.countdown("nan_loss")
        self.desync = rank_faults.countdown("desync_weights")
        self.drift = rank_faults.span("drift_weights", faults.DRIFT_PUSHES)

    def metas(self, work: TrainWork) -> list[SampleMeta]:
        """The step's metadata, with NaN rewards (hence NaN advantages and loss) when the fault fires."""
        metas = work.metas
        if not self.nan.fire():
            return metas
        logger.warning("injected fault: NaN rewards in the batch of step %d", work.step)
        return [replace(m, reward=math.nan) for m in metas]

    def after_push(self, trainer: Any) -> None:
        desync, drift = self.desync.fire(), self.drift.fire()  # both count every push
        if not (desync or drift):
            return
        import torch

        logger.warning(
            "injected fault: the trainer's weights drift from the engines' (noise std %g)", faults.DESYNC_STD
        )
        with torch.no_grad():
            for param in trainer.module.parameters():
                param.add_(torch.randn_like(param) * faults.DESYNC_STD)


def _reply(ctx: RoleContext, sender: Any | None, message: Any) -> None:
    """Trainer rank 0 (the weight sender) answers for all trainer ranks.

    The answer is delivered before the trainer goes on: a weight push follows most answers, and
    the orchestrator tells the engines to join it only once it has the answer whole (a large one
    completes only while the trainer makes MPI progress, which a gloo collective does not).
    """
    if sender is not None:
        send(ctx.world, message, ctx.orchestrator_rank, Tag.RESULT)
        flush_sends()


def _push_weights(
    ctx: RoleContext, trainer: Any, cfg: HetrlConfig, sender: Any | None, version: int, attempt: int = 0
) -> None:
    """Stream the weights in HF layout to the engines (every trainer rank takes part in the gathers).

    A push that breaks off (an engine did not take a bucket within ``rollout.weight_sync_timeout_s``,
    or went away) is reported to the orchestrator, which knows which engines had not answered
    and names them as it stops the job.
    """
    bucket_bytes = cfg.rollout.weight_sync_bucket_bytes(on_gpu=trainer.groups.device.type == "cuda")
    buckets = iter_hf_weight_buckets(trainer.module, cfg.model.vocab_size, bucket_bytes=bucket_bytes)
    liveness.busy(f"pushing weights v{version} to the engines")
    with timeline.span("push weights"):
        _stream(ctx, sender, buckets, version, attempt)
    liveness.tick()


def _stream(ctx: RoleContext, sender: Any | None, buckets: Any, version: int, attempt: int) -> None:
    if sender is None:
        for _ in buckets:  # non-zero ranks only contribute their shards to the gathers
            pass
    else:
        try:
            sender.send(buckets, version, attempt)
        except WeightStreamBroken as error:  # a timeout or a lost engine; the group cannot carry another push
            logger.error("%s", error)
            send(
                ctx.world,
                PushFailed(version, attempt, str(error.__cause__ or error).splitlines()[0]),
                ctx.orchestrator_rank,
                Tag.RESULT,
            )
            flush_sends()


def _critic_state(critic: Any | None) -> tuple[Any, Any, Any] | None:
    return None if critic is None else (critic.model, critic.optimizer, critic.scheduler)


def _save(trainer: Any, critic: Any | None, cfg: HetrlConfig, run_dir: Path, message: Checkpoint, version: int) -> Path:

    if message.step != version:
        raise RuntimeError(f"orchestrator asked for a checkpoint of v{message.step}, the trainer holds v{version}")
    return save_checkpoint(
        checkpoint_root(run_dir),
        version,
        trainer.model,
        trainer.optimizer,
        trainer.scheduler,
        extra={"version": version, "loop": message.loop_state},
        keep=cfg.checkpoint.keep,
        pg_collection=trainer.groups.pg_collection,
        critic=_critic_state(critic),
    )


def _restore(trainer: Any, critic: Any | None, path: str) -> tuple[int, dict[str, Any]]:

    state = load_checkpoint(
        path,
        trainer.model,
        trainer.optimizer,
        trainer.scheduler,
        pg_collection=trainer.groups.pg_collection,
        critic=_critic_state(critic),
    )
    trainer.step = state.step
    logger.info("resumed from %s at v%d (RNG restored: %s)", state.path, state.extra["version"], state.rng_restored)
    return state.extra["version"], state.extra["loop"]
