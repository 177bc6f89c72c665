"""The orchestrator: owns the task stream, every sample id, the schedule and the staleness bound.

One rank on the CPU partition, dealing in metadata alone (:class:`~hetrl.records.SampleMeta`): the
payloads stay with the engine that generated them (see ``hetrl.control.protocol``). It hands episodes to
the rollout ranks, naming the reward worker each engine sends its finished samples' scoring views to,
merges the workers' verdicts into the metadata, assembles each step's batch from complete groups, has
each engine ship its samples of the step to the trainer replicas that train on them, and sends the
step's metadata, once, to the trainer's leader (trainer rank 0), which shares it inside the trainer;
the trainer pushes its new weights straight to the engines (torch.distributed), the orchestrator only
tells the engines when to take them.
When an engine refuses a push (:class:`PushRefused`), the orchestrator has the trainer send the
same version again, unless a newer push is on its way; the engine's samples from its old version
meet the staleness bound.

The three schedules are one mechanism with a different look-ahead: groups may be dispatched while
``in flight + ready + in training < prompts_per_step x (1 + look-ahead)``, with look-ahead 0 for
``sync`` (generate, then train, strictly alternating), 1 for ``one_step_off`` and the staleness
bound for ``async``. A group is trained only if its oldest token is at most the bound's number of
versions behind the trainer; older groups are dropped or regenerated and counted. The bound is 0
for sync and ``max_staleness`` otherwise, unless ``schedule.adaptive_staleness`` lets an async
bound float (hetrl.loop.staleness): the orchestrator then feeds it each RL step's metrics
(:meth:`Orchestrator.observe_step`) and holds the next step to where it stands, in both its
look-ahead and its filter, so groups generated under a larger bound meet the stale policy.

Colocated engines take turns with the trainer on its GPUs: before every train step (warm start
included) the orchestrator has each engine sleep and waits until all have (:class:`ReleaseMemory`,
:class:`MemoryReleased`); the step's push wakes them. Under one-step-off and async the look-ahead's
unfinished samples then wait through the step instead of generating beside it.

With a monitor attached (:meth:`Orchestrator.attach_monitor`), the orchestrator reports the role
states the console shows: each role is marked busy when given work and idle when it has none left,
its results count as progress, and the orchestrator's waits are sliced so the monitor redraws the
console meanwhile (hangs are caught by the liveness watchdog, docs/hangs.md). It also adds
``time/reward`` to each step's trainer metrics: the reward workers' scoring time of the samples
trained in that step.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetrl.config.schema import HetrlConfig
from hetrl.control import liveness
from hetrl.control.comm import PeerTimeout, RoleContext, Tag, naps, poll, send
from hetrl.control.protocol import (
    DropSamples,
    MemoryReleased,
    PushFailed,
    PushRefused,
    PushWeights,
    ReleaseMemory,
    RescoreSamples,
    RewardDone,
    RolloutDone,
    RolloutWork,
    ScoredSample,
    ServingWeights,
    ShipSamples,
    Shutdown,
    SyncWeights,
    TrainDone,
    TrainerLayout,
    TrainShard,
    TrainWork,
)
from hetrl.control.role_loop import RoleLoop
from hetrl.env.episodes import group_items
from hetrl.env.registry import build_held_out_split
from hetrl.env.tasks.base import TaskStream
from hetrl.loop.batching import require_room
from hetrl.loop.staleness import build_adaptive_bound, fixed_bound, look_ahead
from hetrl.monitor import names
from hetrl.monitor.eval import eval_metrics
from hetrl.monitor.guards import IDLE
from hetrl.records import EpisodeItem, Sample, SampleMeta, SamplingParams, id_order
from hetrl.trainer.shards import step_shards

logger = logging.getLogger(__name__)
_POLL_S = 1.0  # how often a waiting orchestrator has the monitor redraw the console
# A sample whose scoring failed this many times in a row (a rubric crash; the worker rebuilds its rubric, and the
# retry goes to another worker when there is one) stops the job: its rubric breaks on it, retrying would never end.
MAX_SCORING_FAILURES = 3


@dataclass
class _Ledger:
    """Where every sample id is; proves none is lost or trained on twice."""

    dispatched: dict[str, EpisodeItem] = field(default_factory=dict)  # at an engine
    at_engine: dict[str, int] = field(default_factory=dict)  # sample id -> engine rank
    rewarding: dict[str, SampleMeta] = field(default_factory=dict)  # at a reward worker (which has its ScoringView)
    # sample id -> the world rank holding its payloads (its engine; the orchestrator for demonstrations), from its
    # generation until it is shipped to the trainer or dropped
    held_at: dict[str, int] = field(default_factory=dict)
    scoring_failures: dict[str, list[int]] = field(default_factory=dict)  # sample id -> workers that failed it
    issued: set[str] = field(default_factory=set)  # every training sample id ever dispatched
    trained: set[str] = field(default_factory=set)
    dropped: set[str] = field(default_factory=set)  # stale or uninformative groups, never trained
    dropped_stale: int = 0
    regenerated: int = 0  # stale samples generated again under their ids (schedule.stale_policy=regenerate)
    requeued_generation: int = 0  # episodes re-run after an engine failure
    requeued_reward: int = 0  # samples re-scored after a reward-worker failure
    # Issued, trained and dropped counts of the run's earlier processes (from the checkpoint it resumed);
    # their ids are not kept: a resumed run's sets hold only its own.
    earlier: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("issued", "trained", "dropped"), 0))

    def unaccounted(self, waiting: set[str]) -> set[str]:
        """Issued training ids that are neither trained, dropped, in flight, nor waiting in a group."""
        in_flight = set(self.dispatched) | set(self.rewarding) | waiting
        return self.issued - self.trained - self.dropped - in_flight

    def settled(self) -> dict[str, int]:
        """The whole run's issued, trained and dropped counts without the ids still in flight: what a
        checkpoint carries, since a resumed run issues those again (the same ids, generated again)."""
        trained = self.trained & self.issued  # warm-start demonstrations are trained, never issued
        return {
            "issued": self.earlier["issued"] + len(trained) + len(self.dropped),
            "trained": self.earlier["trained"] + len(trained),
            "dropped": self.earlier["dropped"] + len(self.dropped),
        }


def sampling_for(cfg: HetrlConfig, purpose: str, eos_token_id: int) -> SamplingParams:
    """Sampling of training rollouts (the recipe's rollout keys) or of evaluation (eval temperature)."""
    r = cfg.rollout
    if purpose == "eval":
        return SamplingParams(
            n=1, temperature=cfg.eval.temperature, max_tokens=r.max_tokens, stop=r.stop, stop_token_ids=[eos_token_id]
        )
    return SamplingParams(
        n=1,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_tokens=r.max_tokens,
        stop=r.stop,
        stop_token_ids=[eos_token_id],
    )


def group_lag(group: list[SampleMeta], trainer_version: int) -> int:
    """Policy versions between the trainer and the group's oldest sampled token (0 if none was sampled)."""
    versions = [s.min_version for s in group if s.min_version >= 0]
    return trainer_version - min(versions) if versions else 0


class Orchestrator:
    def __init__(self, ctx: RoleContext, cfg: HetrlConfig, run_dir: Path, tokenizer: Any) -> None:

        self.ctx, self.cfg, self.run_dir, self.tokenizer = ctx, cfg, run_dir, tokenizer
        # Once per run, here: the training stream walks the training side of the held-out split.
        self.split = build_held_out_split(cfg.env, seed=cfg.run.seed, num_eval_tasks=cfg.eval.num_tasks)
        self.stream = TaskStream(self.split.training, seed=cfg.run.seed)
        self.engines = ctx.plan.ranks_of("rollout")
        self.reward_ranks = ctx.plan.ranks_of("reward")
        self.trainer_leader = ctx.plan.ranks_of("trainer")[0]  # the one trainer rank the orchestrator talks to
        self.version = 0
        self.ledger = _Ledger()
        self.groups: dict[str, list[SampleMeta]] = defaultdict(list)  # rewarded samples per group
        self.ready: list[list[SampleMeta]] = []  # complete groups waiting for the trainer
        self.results: dict[str, list[SampleMeta]] = defaultdict(list)  # purpose -> rewarded samples
        self.layout: TrainerLayout | None = None  # where each trainer replica receives its shard (the leader says)
        self._held: dict[str, Sample] = {}  # payloads the orchestrator holds itself: warm-start demonstrations
        # verdicts that came before their sample's RolloutDone (engine -> reward -> orchestrator may overtake
        # engine -> orchestrator): applied when it comes
        self._early: dict[str, tuple[ScoredSample | None, int]] = {}  # None: its scoring failed
        self._reward_of: dict[str, int] = {}  # sample id -> the reward worker charged with scoring it
        self.purpose_of: dict[str, str] = {}
        self.engine_load = dict.fromkeys(self.engines, 0)
        self.serving = dict.fromkeys(self.engines, 0)  # the weights version each engine has reported serving
        self.reward_load = dict.fromkeys(self.reward_ranks, 0)
        self.train_done: TrainDone | None = None
        self._training = False  # a step is at the trainer: the push that follows it supersedes any other
        self._awake: set[int] = set()  # colocated engines told to sleep that have not yet said they did
        self._push_attempt = 0  # sends of the current version's weights so far, minus one
        # engine -> since when (monotonic) it has owed an answer to a push: a newer push does not restart
        # the clock of an engine that never took the older one, an answer to an older one does.
        self._push_pending: dict[int, float] = {}
        self.refused_pushes = 0  # since the last take_refused_pushes()
        self.refused_pushes_total = 0
        self.regenerated = 0  # stale samples generated again since the last take_regenerated()
        self._next_group = 0
        self._train_groups_open = 0  # dispatched training groups not yet complete
        self._open_tasks: dict[str, int] = {}  # training group id -> its task's stream cursor, until trained or dropped
        self._resumed: list[tuple[str, int]] = []  # the checkpoint's in-flight groups (id, cursor), dispatched first
        self._reward_s: dict[str, float] = defaultdict(float)  # training sample id -> its share of scoring time
        self.monitor: Any | None = None
        self.adaptive_bound = build_adaptive_bound(cfg.schedule)  # None: the schedule's bound is fixed
        # What pump does with each result; its wait is its own (one result at a time, inside the schedule).
        self._results = RoleLoop(
            ctx,
            {
                RolloutDone: self._on_rollout,
                RewardDone: self._on_reward,
                TrainDone: self._on_train_done,
                TrainerLayout: self._on_layout,
                PushRefused: self._on_push_refused,
                ServingWeights: self._on_serving,
                PushFailed: self._on_push_failed,
                MemoryReleased: self._on_memory_released,
            },
            tag=Tag.RESULT,
        )

    def attach_monitor(self, monitor: Any) -> None:
        """Report role states and progress to ``monitor`` (a hetrl.monitor.Monitor) and have it redraw the console while
        waiting."""
        self.monitor = monitor
        for role in ("rollout", "reward", "trainer"):
            monitor.progress(role, state=IDLE)

    def _report(self, role: str, busy: bool, state: str) -> None:
        if self.monitor is not None:
            self.monitor.progress(role, state=state if busy else IDLE)

    # ------------------------------------------------------------------ dispatch

    def sampling(self, purpose: str) -> SamplingParams:
        return sampling_for(self.cfg, purpose, self.tokenizer.eos_token_id)

    def new_groups(
        self, tasks_with_seeds: list[tuple[Any, int]], group_size: int, purpose: str
    ) -> list[list[EpisodeItem]]:
        groups = []
        for task, seed in tasks_with_seeds:
            groups.append(group_items(f"{purpose[0]}{self._next_group}", task, seed, group_size))
            self._next_group += 1
        return groups

    def dispatch(self, groups: list[list[EpisodeItem]], purpose: str) -> None:
        """Give each group to the least-loaded engine (a group stays together: shared prompt cache).

        Each engine gets its share in ONE message, so it starts all of it in the same decoding step:
        the engine's batches then do not depend on message timing, which keeps sync runs
        reproducible to the bit (vLLM's numerics depend on the batch a sequence is decoded in).
        """
        per_engine: dict[int, list[EpisodeItem]] = defaultdict(list)
        for group in groups:
            engine = min(self.engines, key=lambda r: self.engine_load[r])
            per_engine[engine].extend(group)
            for item in group:
                self.ledger.dispatched[item.sample_id] = item
                self.ledger.at_engine[item.sample_id] = engine
                self.purpose_of[item.group_id] = purpose
                if purpose == "train":
                    self.ledger.issued.add(item.sample_id)
            self.engine_load[engine] += len(group)
        sampling = self.sampling(purpose)
        for engine, items in per_engine.items():
            work = RolloutWork(items, sampling, purpose, self._reward_rank([item.sample_id for item in items]))
            send(self.ctx.world, work, engine, Tag.WORK)
        self._report("rollout", bool(per_engine), "generating")

    def _reward_rank(self, sample_ids: list[str], avoid: int | None = None) -> int:
        """The least-loaded reward worker (another than ``avoid`` if there is one), charged with ``sample_ids``: it
        scores them once their engine has finished them and sent it their views."""
        workers = [r for r in self.reward_ranks if r != avoid] or self.reward_ranks
        worker = min(workers, key=lambda r: self.reward_load[r])
        self.reward_load[worker] += len(sample_ids)
        for sample_id in sample_ids:
            self._reward_of[sample_id] = worker
        return worker

    # ------------------------------------------------------------------ message pump

    def pump(self, waiting_for: str, timeout_s: float | None = None) -> None:
        """Handle one incoming result (waiting up to ``timeout_s``, sleeping, not spinning).

        The wait is sliced so the monitor redraws the console meanwhile. The orchestrator counts as idle
        while it waits (``waiting_for`` says on what), and as busy from a result on: if the whole job
        stops moving, the liveness watchdog names what it was waiting for; if the orchestrator itself
        stops between two waits, it is named as stuck.
        """
        liveness.idle(f"waiting for {waiting_for}")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        redraw_at = time.monotonic() + _POLL_S
        pauses = naps()  # one wait: after its first second an idle orchestrator polls 50 times a second, not 500
        while (got := poll(self.ctx.world, tag=Tag.RESULT)) is None:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise PeerTimeout(f"waited {timeout_s:.0f} s for a result from any rank")
            if now >= redraw_at:
                redraw_at = now + _POLL_S
                if self.monitor is not None:
                    self.monitor.poll()
                self._check_push_deadline()
            time.sleep(next(pauses) if deadline is None else min(next(pauses), max(0.0, deadline - now)))
        message, source, _ = got
        liveness.busy(f"handling a result, then on with the loop (was waiting for {waiting_for})")
        self._results.handle(message, source)

    def _on_train_done(self, message: TrainDone, trainer: int) -> None:
        self.train_done = message

    def _on_layout(self, message: TrainerLayout, trainer: int) -> None:
        self.layout = message

    def _on_serving(self, message: ServingWeights, engine: int) -> None:
        self.serving[engine] = max(self.serving[engine], message.version)
        if message.version >= self.version:
            self._push_pending.pop(engine, None)
        elif engine in self._push_pending:  # a late answer to an older push: alive, and owing the current one
            self._push_pending[engine] = time.monotonic()

    def _on_memory_released(self, message: MemoryReleased, engine: int) -> None:
        self._awake.discard(engine)

    def _on_rollout(self, message: RolloutDone, engine: int) -> None:
        """Finished samples go to their reward worker (their engine sent it their views); lost episodes run again."""
        for meta in message.metas:
            if self.ledger.dispatched.pop(meta.sample_id, None) is None:
                raise RuntimeError(f"engine {engine} returned unknown or duplicate sample {meta.sample_id}")
            del self.ledger.at_engine[meta.sample_id]
            self.ledger.rewarding[meta.sample_id] = meta
            self.ledger.held_at[meta.sample_id] = engine
        self.engine_load[engine] -= len(message.metas) + len(message.failed)
        if message.failed:
            self._requeue_episodes(message.failed, engine)
        if message.metas:
            self._report("reward", True, "scoring")
        for meta in message.metas:
            if meta.sample_id not in self._early:
                continue
            verdict, worker = self._early.pop(meta.sample_id)
            if verdict is None:
                self._score_again([meta.sample_id], worker)
            else:
                self._take_verdict(verdict, worker)
        self._report("rollout", any(self.engine_load.values()), "generating")

    def _on_push_refused(self, message: PushRefused, engine: int) -> None:
        """An engine refused a push and serves its old weights: have the trainer send it again.

        Not while a step is at the trainer (its push comes next and supersedes this one), nor for a
        send already superseded: several engines refusing one send get one send again.
        """
        if (message.version, message.attempt) == (self.version, self._push_attempt):
            self._push_pending.pop(engine, None)
        self.refused_pushes += 1
        self.refused_pushes_total += 1
        logger.warning(
            "engine rank %d refused weight push v%d (send %d): %s",
            engine,
            message.version,
            message.attempt + 1,
            message.reason,
        )
        if self._training or (message.version, message.attempt) != (self.version, self._push_attempt):
            return
        self._push_attempt += 1
        self.to_trainer(PushWeights(self.version, self._push_attempt))
        self.sync_engines(self.version, self._push_attempt)

    def _on_push_failed(self, message: PushFailed, trainer: int) -> None:
        """The trainer's push broke off: name the engines that had not taken it, and stop."""
        current = (message.version, message.attempt) == (self.version, self._push_attempt)
        self._push_not_taken(
            message.version,
            message.attempt,
            f"broke off on the trainer: {message.reason}",
            set(self._push_pending) if current else set(),
        )

    def _check_push_deadline(self) -> None:
        """A push must be taken by every engine within ``rollout.weight_sync_timeout_s`` of being
        announced; a sender's buffers can absorb a push to an engine that is gone, so the trainer
        alone cannot tell."""
        timeout_s = self.cfg.rollout.weight_sync_timeout_s
        now = time.monotonic()
        late = {engine for engine, since in self._push_pending.items() if now - since > timeout_s}
        if late:
            self._push_not_taken(
                self.version,
                self._push_attempt,
                f"was not taken within rollout.weight_sync_timeout_s={timeout_s:g} s",
                late,
            )

    def _push_not_taken(self, version: int, attempt: int, what: str, pending: set[int]) -> None:
        who = (
            ", ".join(f"rollout[{self.engines.index(r)}] (world rank {r})" for r in sorted(pending))
            or "none known (every engine answered)"
        )
        raise RuntimeError(
            f"weight push v{version} (send {attempt + 1}) {what}. "
            f"Engines that did not take it: {who}. See their logs (RUN/logs/rollout_<n>.log)"
        )

    def sync_engines(self, version: int, attempt: int = 0) -> None:
        """Tell every engine to receive the push of ``version`` the trainer is sending."""
        self.version, self._push_attempt = version, attempt
        now = time.monotonic()
        self._push_pending = {
            engine: self._push_pending.get(engine, now) for engine in self.engines
        }  # until each serves it or refuses it
        for engine in self.engines:
            send(self.ctx.world, SyncWeights(version, attempt), engine, Tag.WORK)

    def take_refused_pushes(self) -> int:
        """Pushes engines refused since the previous call (the ``weight_sync/refused_pushes`` metric)."""
        count, self.refused_pushes = self.refused_pushes, 0
        return count

    def _requeue_episodes(self, sample_ids: list[str], failed_engine: int) -> None:
        """Episodes an engine lost go out again under the same ids, to another engine if there is one."""
        logger.warning("engine rank %d lost %d episode(s); re-queueing them", failed_engine, len(sample_ids))
        self.ledger.requeued_generation += len(sample_ids)
        by_group: dict[str, list[EpisodeItem]] = defaultdict(list)
        for sample_id in sample_ids:
            item = self.ledger.dispatched[sample_id]
            by_group[item.group_id].append(item)
        others = [r for r in self.engines if r != failed_engine] or self.engines
        for group_id, items in by_group.items():
            engine = min(others, key=lambda r: self.engine_load[r])
            for item in items:
                self.ledger.at_engine[item.sample_id] = engine
            self.engine_load[engine] += len(items)
            purpose = self.purpose_of[group_id]
            self._uncharge_reward([item.sample_id for item in items])  # its first worker will not see them
            work = RolloutWork(items, self.sampling(purpose), purpose, self._reward_rank([i.sample_id for i in items]))
            send(self.ctx.world, work, engine, Tag.WORK)

    def _uncharge_reward(self, sample_ids: list[str]) -> None:
        """The reward workers charged with ``sample_ids`` are done with them (scored, failed, or sent elsewhere)."""
        for sample_id in sample_ids:
            worker = self._reward_of.pop(sample_id, None)
            if worker is not None:
                self.reward_load[worker] -= 1

    def _on_reward(self, message: RewardDone, worker: int) -> None:
        """Merge the worker's verdicts into the samples' metadata; its failed samples are scored again. A verdict on a
        sample whose RolloutDone has not come yet (it may overtake it) waits for it."""
        self._uncharge_reward([v.sample_id for v in message.scored] + message.failed)
        self._charge_scoring(message)
        failed = []
        for sample_id in message.failed:
            if sample_id in self.ledger.dispatched:
                self._early[sample_id] = (None, worker)
            else:
                failed.append(sample_id)
        if failed:
            self._score_again(failed, worker)
        for verdict in message.scored:
            if verdict.sample_id in self.ledger.dispatched:
                self._early[verdict.sample_id] = (verdict, worker)
            else:
                self._take_verdict(verdict, worker)
        self._report("reward", any(self.reward_load.values()), "scoring")

    def _take_verdict(self, verdict: ScoredSample, worker: int) -> None:
        """A sample's verdict into its metadata; a complete group is ready to train (or its evaluation done)."""
        meta = self.ledger.rewarding.pop(verdict.sample_id, None)
        if meta is None:
            raise RuntimeError(f"reward worker {worker} returned unknown or duplicate sample {verdict.sample_id}")
        self.ledger.scoring_failures.pop(verdict.sample_id, None)
        verdict.apply_to(meta)
        group = self.groups[meta.group_id]
        group.append(meta)
        if len(group) == self._group_size(meta.group_id):
            del self.groups[meta.group_id]
            purpose = self.purpose_of.pop(meta.group_id)
            if purpose == "train":
                self._train_groups_open -= 1
                self.ready.append(sorted(group, key=lambda m: m.sample_id))
            else:
                self.results[purpose].extend(group)

    def _score_again(self, sample_ids: list[str], worker: int) -> None:
        """Samples whose scoring failed (the worker's rubric broke and was rebuilt) go to another worker if there is
        one (their engines send it their views again); a sample failed ``MAX_SCORING_FAILURES`` times in a row stops
        the job, naming the workers."""
        logger.warning("reward worker rank %d failed %d sample(s); retrying them", worker, len(sample_ids))
        for sample_id in sample_ids:
            if sample_id not in self.ledger.rewarding:
                raise RuntimeError(f"reward worker {worker} failed unknown or already scored sample {sample_id}")
            failed_on = self.ledger.scoring_failures.setdefault(sample_id, [])
            failed_on.append(worker)
            if len(failed_on) >= MAX_SCORING_FAILURES:
                who = ", ".join(f"reward[{self.reward_ranks.index(r)}] (world rank {r})" for r in failed_on)
                raise RuntimeError(
                    f"sample {sample_id} failed scoring {len(failed_on)} times in a row, on {who}, each time on a "
                    "rebuilt rubric: it cannot be scored. See their logs (RUN/logs/reward_<n>.log)"
                )
        self.ledger.requeued_reward += len(sample_ids)
        other = self._reward_rank(sample_ids, avoid=worker)
        for engine, ids in self._by_holder(sample_ids).items():
            send(self.ctx.world, RescoreSamples(ids, other), engine, Tag.WORK)
        self._report("reward", True, "scoring")

    def _by_holder(self, sample_ids: Any) -> dict[int, list[str]]:
        """``sample_ids`` (those held anywhere) by the rank holding their payloads."""
        held: dict[int, list[str]] = defaultdict(list)
        for sample_id in sample_ids:
            if sample_id in self.ledger.held_at:
                held[self.ledger.held_at[sample_id]].append(sample_id)
        return held

    def _drop_held(self, sample_ids: Any) -> None:
        """Have the holders of ``sample_ids`` forget their payloads (evaluated, dropped, or to be generated again)."""
        for holder, ids in self._by_holder(sample_ids).items():
            for sample_id in ids:
                del self.ledger.held_at[sample_id]
            if holder == self.ctx.rank:
                for sample_id in ids:
                    del self._held[sample_id]
            else:
                send(self.ctx.world, DropSamples(ids), holder, Tag.WORK)

    def _charge_scoring(self, message: RewardDone) -> None:
        """Split the batch's scoring time evenly over its training samples (failed ones too: they cost it)."""
        ids = [s.sample_id for s in message.scored] + message.failed
        share = message.score_s / len(ids) if ids else 0.0
        for sample_id in ids:
            if sample_id in self.ledger.issued:
                self._reward_s[sample_id] += share

    def _group_size(self, group_id: str) -> int:
        return self.cfg.algorithm.group_size if self.purpose_of[group_id] == "train" else self.cfg.eval.k

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, tasks_with_seeds: list[tuple[Any, int]]) -> tuple[float, dict[str, float]]:
        """Held-out evaluation (greedy by default): mean reward, and pass@k / mean@k per task.

        It scores the current policy: it starts once every engine serves the current version.
        """
        while min(self.serving.values()) < self.version:  # an engine that refused the push is being sent it again
            self.pump(f"every engine to serve v{self.version}", timeout_s=600)
        self.dispatch(self.new_groups(tasks_with_seeds, self.cfg.eval.k, "eval"), "eval")
        while len(self.results["eval"]) < len(tasks_with_seeds) * self.cfg.eval.k:
            self.pump("held-out evaluation episodes and their rewards", timeout_s=600)
        samples, self.results["eval"] = sorted(self.results["eval"], key=lambda s: id_order(s.sample_id)), []
        self._drop_held(s.sample_id for s in samples)
        require_room(samples, self.cfg.env.max_episode_tokens, "evaluation")
        mean_reward = sum(s.reward for s in samples) / len(samples)
        return mean_reward, eval_metrics(samples, ks=sorted({1, self.cfg.eval.k}))

    # ------------------------------------------------------------------ training steps

    def to_trainer(self, message: Any) -> None:
        """Send ``message`` to the trainer: to its leader, which shares it with every trainer rank."""
        send(self.ctx.world, message, self.trainer_leader, Tag.WORK)

    def hold(self, sample: Sample) -> SampleMeta:
        """Keep a sample made here (a warm-start demonstration) to ship to the trainer as engines do theirs."""
        self._held[sample.sample_id] = sample
        self.ledger.held_at[sample.sample_id] = self.ctx.rank
        return SampleMeta.of(sample)

    def train(self, step: int, groups: list[list[SampleMeta]], supervised: bool = False) -> TrainDone:
        """Have the step's samples shipped to the trainer replicas, send it the step's metadata (once), and wait for
        the new version."""
        metas = [m for g in groups for m in g]
        if not supervised:
            require_room(metas, self.cfg.env.max_episode_tokens, f"RL step {step}")
        for m in metas:
            if m.sample_id in self.ledger.trained:
                raise RuntimeError(f"sample {m.sample_id} would be trained on twice")
            self.ledger.trained.add(m.sample_id)
            self._open_tasks.pop(m.group_id, None)
        while self.layout is None:
            self.pump("the trainer's layout (where each replica receives its shard)", timeout_s=3600)
        self.train_done, self._training = None, True
        self._ship(step, metas, num_minibatches=1 if supervised else self.cfg.trainer.updates_per_batch)
        if self.cfg.rollout.placement == "colocated":
            self._release_engines(step)
        self.to_trainer(TrainWork.of(step, metas, supervised))
        self._report("trainer", True, "training")
        while self.train_done is None:
            self.pump(f"the trainer's step {step} (v{self.version} -> v{self.version + 1})", timeout_s=3600)
        done, self.train_done, self._training = self.train_done, None, False
        self._report("trainer", False, "training")
        if not supervised:
            done.metrics[names.time_phase("reward")] = sum(self._reward_s.pop(m.sample_id, 0.0) for m in metas)
        self.sync_engines(done.version)
        return done

    def _ship(self, step: int, metas: list[SampleMeta], num_minibatches: int) -> None:
        """Each holder sends each trainer replica its samples of the step, with their verdicts: one
        :class:`ShipSamples` per engine (its part of every replica's shard), the orchestrator's own demonstrations
        as :class:`TrainShard` straight away. The replicas are dealt by the trainer's own function
        (``hetrl.trainer.shards``) on the same metadata and layout, so both sides agree on every sample."""
        layout = self.layout
        missing = [m.sample_id for m in metas if m.sample_id not in self.ledger.held_at]
        if missing:
            raise RuntimeError(f"step {step}: no rank holds samples {missing[:8]}")
        shards = step_shards(
            metas, num_minibatches, len(layout.receivers), layout.tokens_per_image, layout.shared_prompts
        )
        per_holder: dict[int, list[tuple[int, list[SampleMeta]]]] = defaultdict(list)
        for receiver, indices in zip(layout.receivers, shards):
            by_holder: dict[int, list[SampleMeta]] = defaultdict(list)
            for i in indices:
                by_holder[self.ledger.held_at.pop(metas[i].sample_id)].append(metas[i])
            for holder, part in by_holder.items():
                per_holder[holder].append((receiver, part))
        for holder, parts in per_holder.items():
            if holder != self.ctx.rank:
                send(self.ctx.world, ShipSamples(step, parts), holder, Tag.WORK)
                continue
            for receiver, part in parts:
                samples = [m.scored(self._held.pop(m.sample_id)) for m in part]
                send(self.ctx.world, TrainShard(step, samples), receiver, Tag.SHARD)

    def _release_engines(self, step: int) -> None:
        """Colocated engines give the trainer their GPU memory: the step starts once every one has slept.

        Whatever the schedule: under one-step-off and async the engines' unfinished samples wait through
        the step (interrupted, resumed after its push), since an engine that kept generating would keep
        the memory the trainer needs. Bounded by ``rollout.weight_sync_timeout_s``, the bound of the
        push that wakes them.
        """
        self._awake = set(self.engines)
        for engine in self.engines:
            send(self.ctx.world, ReleaseMemory(), engine, Tag.WORK)
        timeout_s = self.cfg.rollout.weight_sync_timeout_s
        deadline = time.monotonic() + timeout_s
        while self._awake:
            left = deadline - time.monotonic()
            if left <= 0:
                who = ", ".join(f"rollout[{self.engines.index(r)}] (world rank {r})" for r in sorted(self._awake))
                raise RuntimeError(
                    f"colocated engines did not release their memory for step {step} within "
                    f"rollout.weight_sync_timeout_s={timeout_s:g} s: {who}. See their logs (RUN/logs/rollout_<n>.log)"
                )
            try:
                self.pump(f"colocated engines to release their memory for step {step}", timeout_s=left)
            except PeerTimeout:
                continue  # the deadline passed: named above

    # ------------------------------------------------------------------ the schedule

    def staleness_bound(self) -> int:
        """The bound the next step's batch is held to: the schedule's, or where its adaptive bound stands."""
        return fixed_bound(self.cfg.schedule) if self.adaptive_bound is None else self.adaptive_bound.bound

    def dispatch_target(self, bound: int) -> int:
        """Training groups to keep outstanding under ``bound``: one step's prompts and the look-ahead's."""
        return self.cfg.run.prompts_per_step * (1 + look_ahead(self.cfg.schedule, bound))

    def observe_step(self, metrics: dict[str, float]) -> None:
        """An RL step's metrics (the trainer's, the mismatch): the adaptive bound, if any, moves on them."""
        if self.adaptive_bound is not None:
            self.adaptive_bound.observe(metrics)

    def outstanding_groups(self) -> int:
        """Training groups dispatched and not yet trained on (at engines, at reward workers, ready)."""
        return self._train_groups_open + len(self.ready)

    def top_up(self, target_groups: int) -> None:
        """Dispatch training groups up to ``target_groups`` outstanding: a resumed checkpoint's in-flight ones first."""
        missing = target_groups - self.outstanding_groups()
        if missing <= 0:
            return
        resumed, self._resumed = self._resumed[:missing], self._resumed[missing:]
        groups = [self._train_group(group_id, cursor, *self.stream.at(cursor)) for group_id, cursor in resumed]
        for _ in range(missing - len(resumed)):
            cursor = self.stream.cursor
            groups.append(self._train_group(f"t{self._next_group}", cursor, *self.stream.next()))
            self._next_group += 1
        self.dispatch(groups, "train")
        self._train_groups_open += missing

    def _train_group(self, group_id: str, cursor: int, task: Any, seed: int) -> list[EpisodeItem]:
        self._open_tasks[group_id] = cursor
        return group_items(group_id, task, seed, self.cfg.algorithm.group_size)

    def collect_batch(self, max_lag: int, target_groups: int) -> tuple[list[list[SampleMeta]], int, int]:
        """Wait for ``prompts_per_step`` fresh groups; (DAPO) drop all-equal ones, refilling.

        A group more than ``max_lag`` versions old is dropped and refilled from the stream
        (``schedule.stale_policy=drop``) or generated again by the current policy
        (``regenerate``, :meth:`_regenerate`). Returns the batch and the counts of stale samples
        and all-equal groups dropped.
        """
        want = self.cfg.run.prompts_per_step
        batch: list[list[SampleMeta]] = []
        dropped_stale = dropped_equal = 0
        draws_left = 20 * want  # dynamic sampling gives up refilling after this many extra groups
        while len(batch) < want:
            while not self.ready:
                self.pump(f"complete groups for the next step ({len(batch)}/{want} so far)", timeout_s=3600)
            group = self.ready.pop(0)
            lag = group_lag(group, self.version)
            if lag > max_lag and self.cfg.schedule.stale_policy == "regenerate":
                self._regenerate(group)  # still outstanding: no top-up
                continue
            if lag > max_lag:
                dropped_stale += len(group)
            elif (
                self.cfg.algorithm.resolved_dynamic_sampling and len({s.reward for s in group}) == 1 and draws_left > 0
            ):
                dropped_equal += 1
                draws_left -= 1
            else:
                batch.append(group)
                continue
            self.ledger.dropped_stale += 0 if lag <= max_lag else len(group)
            self.ledger.dropped.update(s.sample_id for s in group)
            self._drop_held(s.sample_id for s in group)
            self._open_tasks.pop(group[0].group_id, None)
            for s in group:
                self._reward_s.pop(s.sample_id, None)
            self.top_up(target_groups - len(batch))  # the batch so far counts against the target
        return batch, dropped_stale, dropped_equal

    def _regenerate(self, group: list[SampleMeta]) -> None:
        """Dispatch a complete, stale group again: the same group and sample ids, task and episode
        seeds (from the task's stream cursor), sampled by the policy the engines were last told to
        serve. It stays outstanding (so counts against the top-up target) until it completes again;
        its old samples and their scoring time are discarded."""
        group_id = group[0].group_id
        ids = sorted(s.sample_id for s in group)
        ledger = self.ledger
        settled = [
            i
            for i in ids
            if i in ledger.dispatched or i in ledger.rewarding or i in ledger.trained or i in ledger.dropped
        ]
        if settled:
            raise RuntimeError(
                f"group {group_id} would be regenerated while {settled} are in flight, trained or dropped"
            )
        cursor = self._open_tasks[group_id]
        items = self._train_group(group_id, cursor, *self.stream.at(cursor))
        if sorted(item.sample_id for item in items) != ids:
            raise RuntimeError(f"group {group_id} would be regenerated under other sample ids")
        for sample_id in ids:
            self._reward_s.pop(sample_id, None)
        self._drop_held(ids)  # their engines forget the stale samples before the same ids come again
        ledger.regenerated += len(ids)
        self.regenerated += len(ids)
        self.dispatch([items], "train")
        self._train_groups_open += 1

    def take_regenerated(self) -> int:
        """Stale samples generated again since the previous call (the ``staleness/regenerated`` metric)."""
        count, self.regenerated = self.regenerated, 0
        return count

    # ------------------------------------------------------------------ checkpoint state

    def state_dict(self) -> dict[str, Any]:
        """What a continuation needs: policy version, task cursor, id counter, ledger counts, and the
        training groups in flight (at a sync step boundary there are none).

        In-flight groups are saved as their tasks' stream cursors, not as samples: those came from older
        policies (and may sit half-done at an engine), so a resumed run generates them again, first
        and under the same group ids, with the restored policy. No task is skipped.
        """
        in_flight = [*self._open_tasks.items(), *self._resumed]
        if in_flight:
            logger.info(
                "checkpoint with %d training group(s) in flight: a resume generates them again first", len(in_flight)
            )
        return {
            "version": self.version,
            "stream": self.stream.state_dict(),
            "next_group": self._next_group,
            "in_flight": in_flight,
            "dropped_stale": self.ledger.dropped_stale,
            "adaptive_bound": None if self.adaptive_bound is None else self.adaptive_bound.state_dict(),
            "regenerated": self.ledger.regenerated,
            "requeued_generation": self.ledger.requeued_generation,
            "requeued_reward": self.ledger.requeued_reward,
            "settled": self.ledger.settled(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.version = int(state["version"])
        self.stream.load_state_dict(state["stream"])
        self._next_group = int(state["next_group"])
        self._resumed = [(str(group_id), int(cursor)) for group_id, cursor in state["in_flight"]]
        self.ledger.dropped_stale = int(state["dropped_stale"])
        self.ledger.regenerated = int(state.get("regenerated", 0))  # absent before stale_policy=regenerate existed
        self.ledger.requeued_generation = int(state["requeued_generation"])
        self.ledger.requeued_reward = int(state["requeued_reward"])
        # Absent before the ledger spanned resumes: the counts then start from this process.
        self.ledger.earlier.update({key: int(count) for key, count in state.get("settled", {}).items()})
        if self.adaptive_bound is not None and state.get("adaptive_bound"):  # absent before adaptive_staleness existed
            self.adaptive_bound.load_state_dict(state["adaptive_bound"])

    def ledger_report(self) -> dict[str, int]:
        """Counts that account for every training sample id of the whole run, earlier processes included
        (written into summary.json); ``issued = trained + dropped + in_flight``."""
        waiting = {s.sample_id for group in [*self.groups.values(), *self.ready] for s in group}
        lost = self.ledger.unaccounted(waiting)
        if lost:
            raise RuntimeError(f"{len(lost)} training sample id(s) are unaccounted for, e.g. {sorted(lost)[:5]}")
        in_flight = len(self.ledger.issued - self.ledger.trained - self.ledger.dropped)
        settled = self.ledger.settled()
        return {
            "issued": settled["issued"] + in_flight,
            "trained": settled["trained"],
            "dropped": settled["dropped"],
            "in_flight": in_flight,
            "regenerated": self.ledger.regenerated,
            "requeued_generation": self.ledger.requeued_generation,
            "requeued_reward": self.ledger.requeued_reward,
        }

    def shutdown(self) -> None:
        for rank in self.engines + self.reward_ranks:
            send(self.ctx.world, Shutdown(), rank, Tag.WORK)
        self.to_trainer(Shutdown())
