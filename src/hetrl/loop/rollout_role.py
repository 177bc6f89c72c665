"""The rollout role: one vLLM engine per rank, running many environment episodes at once.

Ownership: the orchestrator hands out :class:`RolloutWork`; this rank runs each item as an
asyncio episode (:class:`hetrl.env.episodes.EpisodeRunner`, at most ``env.concurrency`` at once)
whose ``generate`` calls go to the local engine, and streams finished samples back as soon as a
poll round completes them. The episode's environment runs in this process (``env.placement:
inline``) or on an env rank of the CPU partition (``role``: ``hetrl.loop.env_role``); either way
the token ids stay here.

The rank holds what it generated (the data plane, ``hetrl.control.protocol``): a finished sample's
metadata goes to the orchestrator, its scoring view to the reward rank the work named, and the sample
stays here until the orchestrator has it shipped to the trainer replicas of a step (:class:`ShipSamples`)
or dropped (:class:`DropSamples`). Weight pushes arrive on the weight-sync group when the orchestrator says
:class:`SyncWeights`; they are applied between two decoding steps (in-flight samples are paused
and resumed under the new version).

A colocated engine shares its GPUs with the trainer and takes turns with it: on
:class:`ReleaseMemory` (the orchestrator sends it before every train step, warm start included) it
sleeps and answers :class:`MemoryReleased`; the step's push wakes the weights first
(``wake weights``), and once the push is done the KV cache (``wake kv_cache``), so it generates again
with both back. Each transition is a span of the rank's timeline, also on CPU, where vLLM has no
sleep mode and the memory stays (said once in the rank's log): the turns, not the memory, are what
the engine checks (``GenerationEngine.release_memory``).

An engine failure while generating does not lose work: the episodes it held are cancelled and
reported as ``failed`` (the orchestrator re-queues them under the same sample ids), and the
engine is rebuilt from the checkpoint and the last weight push it applied. Episodes whose env
rank went down are reported as ``failed`` the same way, and re-run on the env ranks still up.

A weight push the engine refuses (checksum mismatch, missing tensors, TP workers that could not
load it) leaves it serving its old version; the rank reports :class:`PushRefused` and the
orchestrator has the push sent again, up to ``rollout.weight_sync_retries`` times in a row. A
broken transport (:class:`WeightStreamBroken`) cannot carry another push and stops the job.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from pathlib import Path
from typing import Any

from hetrl.config.schema import HetrlConfig
from hetrl.control import liveness, timeline
from hetrl.control.comm import RoleContext, Tag, send
from hetrl.control.protocol import (
    DropSamples,
    MemoryReleased,
    PushRefused,
    ReleaseMemory,
    RescoreSamples,
    RewardWork,
    RolloutDone,
    RolloutWork,
    ScoringView,
    ServingWeights,
    ShipSamples,
    Shutdown,
    SyncWeights,
    TrainShard,
)
from hetrl.control.role_loop import Handler, RoleLoop
from hetrl.env.chat import ChatCodec
from hetrl.env.episodes import EpisodeRunner
from hetrl.env.registry import env_factory
from hetrl.loop.env_role import EnvRoleClient
from hetrl.loop.faults import Countdown
from hetrl.records import GenerationRequest, GenerationResult, Sample, SampleMeta, SamplingParams
from hetrl.rollout.engine import GenerationEngine
from hetrl.transport.weights import WeightStreamBroken, WeightSyncError, shared_memory

logger = logging.getLogger(__name__)


class RolloutWorker:
    def __init__(
        self,
        ctx: RoleContext,
        cfg: HetrlConfig,
        model_dir: Path,
        receiver: Any,
        crash: Countdown,
        refuse_push: Countdown,
    ) -> None:
        from transformers import AutoTokenizer

        self.ctx, self.cfg, self.receiver, self.crash, self.refuse_push = ctx, cfg, receiver, crash, refuse_push
        self.refused_in_a_row = 0
        self.model_dir = model_dir
        liveness.starting("starting the generation engine")
        self.engine = self._new_engine()
        liveness.tick()
        self.last_push: Any = None  # the weights live in the engine, kept to rebuild it after a failure
        self.env_client = None
        if cfg.env.placement == "role":
            self.env_client = EnvRoleClient(ctx, cfg.env.call_timeout_s)
        make_env = self.env_client.make_env if self.env_client else env_factory(cfg.env, sandbox=cfg.reward.sandbox)
        self.episodes = EpisodeRunner(
            make_env,
            ChatCodec(AutoTokenizer.from_pretrained(model_dir)),
            self.generate,
            max_turns=cfg.env.max_turns,
            max_episode_tokens=cfg.env.max_episode_tokens,
            concurrency=cfg.env.concurrency,
        )
        self._waiting: dict[str, asyncio.Future] = {}
        self.held: dict[str, Sample] = {}  # finished samples, until shipped to the trainer or dropped
        self._reward_rank: dict[str, int] = {}  # episode id -> the reward rank its work named
        self._request_ids = itertools.count()
        self._episodes_started = False  # since the last engine step
        self.loop = RoleLoop(ctx, self.handlers(), source=ctx.orchestrator_rank)
        self._generating_since: float | None = None  # when work last came to an engine holding no episodes

    def _new_engine(self) -> Any:

        return GenerationEngine(
            self.model_dir,
            self.cfg.rollout,
            dtype=self.cfg.engine_dtype,
            seed=self.cfg.run.seed + self.ctx.assignment.role_rank,
        )

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, images: list[Any] | None = None
    ) -> GenerationResult:
        """One turn of an episode: ``images`` (a multimodal episode's, so far) go to the engine with the ids, one
        placeholder id per image; the episode runner keeps them on the sample."""
        request_id = f"r{self.ctx.rank}-{next(self._request_ids)}"
        future = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        self.engine.submit(GenerationRequest(request_id, prompt_ids, sampling, images=list(images or ())))
        return await future

    def handlers(self) -> dict[type, Handler]:
        """What this rank does with each of the orchestrator's messages."""
        return {
            RolloutWork: self._on_work,
            RescoreSamples: self._on_rescore,
            ShipSamples: self._on_ship,
            DropSamples: self._on_drop,
            SyncWeights: self._on_sync,
            ReleaseMemory: self._on_release,
            Shutdown: self._on_shutdown,
        }

    def _on_work(self, message: RolloutWork, source: int) -> None:
        if self._generating_since is None:
            self._generating_since = time.time()
        for item in message.items:
            self._reward_rank[item.sample_id] = message.reward_rank
            self.episodes.start(item, message.sampling)
        self._episodes_started = True

    def _send_views(self, sample_ids: list[str], reward_rank: int) -> None:
        with_ids = self.cfg.reward.reads_completion_ids
        views = [ScoringView.of(self.held[sample_id], with_ids) for sample_id in sample_ids]
        send(self.ctx.world, RewardWork(views), reward_rank, Tag.WORK)

    def _on_rescore(self, message: RescoreSamples, source: int) -> None:
        self._send_views(message.sample_ids, message.reward_rank)

    def _on_ship(self, message: ShipSamples, source: int) -> None:
        for receiver, metas in message.shards:
            samples = [meta.scored(self.held.pop(meta.sample_id)) for meta in metas]
            send(self.ctx.world, TrainShard(message.step, samples), receiver, Tag.SHARD)

    def _on_drop(self, message: DropSamples, source: int) -> None:
        for sample_id in message.sample_ids:
            del self.held[sample_id]

    def _on_sync(self, message: SyncWeights, source: int) -> None:
        self._wake("weights")
        try:
            self._sync_weights(message)
        finally:
            self._wake("kv_cache")  # the push is in (or refused): generation follows

    def _on_release(self, message: ReleaseMemory, source: int) -> None:
        liveness.busy("releasing the engine's memory for the trainer's step")
        with timeline.span("sleep"):
            self.engine.release_memory()
        send(self.ctx.world, MemoryReleased(), self.ctx.orchestrator_rank, Tag.RESULT)

    def _on_shutdown(self, message: Shutdown, source: int) -> None:
        self.loop.stop = True

    def _wake(self, tag: str) -> None:
        """Bring ``tag`` (``weights``, ``kv_cache``) back if the engine released it: a ``wake <tag>`` span."""
        if tag in self.engine.asleep:
            liveness.busy(f"waking the engine's {tag}")
            with timeline.span(f"wake {tag}"):
                self.engine.wake(tag)

    def _sync_weights(self, message: SyncWeights) -> None:
        """Take part in the push, then serve it; a refused push is reported, and the old version served."""
        staged = None
        liveness.busy(f"receiving weights v{message.version} (serving v{self.engine.version})")
        try:
            with timeline.span("receive weights"):
                staged = self.receiver.receive(message.version, message.attempt)
            if staged.version == self.engine.version:  # sent again for another engine's sake
                send(self.ctx.world, ServingWeights(staged.version), self.ctx.orchestrator_rank, Tag.RESULT)
                return
            if self.refuse_push.fire():
                raise WeightSyncError(
                    f"injected fault: push v{staged.version} refused (as if its checksums did not match)"
                )
            with timeline.span("reload weights"):
                self.engine.load_weights(staged)  # removes the push's shared-memory copy once read
        except WeightStreamBroken:
            raise
        except WeightSyncError as error:
            self._refused(message, error)
            return
        finally:
            if (
                staged is not None and staged.shared_dir is not None
            ):  # a push skipped or refused holds RAM until removed
                shared_memory.remove_push(staged.shared_dir)
        self.refused_in_a_row = 0
        self.last_push = staged.on_host()  # a GPU copy would hold a second model beside the engine's
        send(self.ctx.world, ServingWeights(staged.version), self.ctx.orchestrator_rank, Tag.RESULT)
        logger.info("now serving weights v%d", staged.version)

    def _refused(self, message: SyncWeights, error: WeightSyncError) -> None:
        self.refused_in_a_row += 1
        if self.refused_in_a_row > self.cfg.rollout.weight_sync_retries:
            raise RuntimeError(
                f"this engine refused {self.refused_in_a_row} weight pushes in a row "
                f"(rollout.weight_sync_retries={self.cfg.rollout.weight_sync_retries}); the last: {error}"
            ) from error
        logger.error(
            "weight push v%d refused (%s); still serving v%d, asking for it again",
            message.version,
            error,
            self.engine.version,
        )
        if self.engine.broken:  # TP workers stopped midway: rebuild at the version it served
            self._replace_engine(error)
        send(
            self.ctx.world,
            PushRefused(message.version, message.attempt, str(error)),
            self.ctx.orchestrator_rank,
            Tag.RESULT,
        )

    def _step_engine(self) -> bool:
        """One decoding step; resolve the episodes' pending generate calls. False when idle."""
        if not self.engine.has_work():
            return False
        try:
            if self.crash.fire():
                raise RuntimeError("injected fault: the generation engine crashed")
            results = self.engine.poll()
        except Exception as error:  # noqa: BLE001 - any engine failure is survivable here
            self._replace_engine(error)
            return True
        for result in results:
            self._waiting.pop(result.request_id).set_result(result)
        return True

    def _replace_engine(self, error: BaseException) -> None:
        """Cancel the episodes the engine held, report them for re-queueing, rebuild the engine."""
        cancelled = self.episodes.cancel()
        logger.error("generation engine failed (%r): re-queueing %d episode(s) and rebuilding it", error, cancelled)
        self._waiting.clear()
        try:
            self.engine.shutdown()
        except Exception:  # noqa: BLE001 - the broken engine may not shut down cleanly
            logger.warning("the failed engine did not shut down cleanly", exc_info=True)
        self.engine = self._new_engine()
        if self.last_push is not None:
            self.engine.load_weights(self.last_push)

    async def run(self) -> None:
        """The role loop's rounds until Shutdown (``hetrl.control.role_loop``): the orchestrator's messages, then
        :meth:`_work`. A round that moved nothing naps: episodes waiting on tools or env ranks must not spin the
        core their tools need."""
        await self.loop.arun(self._work, self._activity, self._idle)
        if self.env_client:
            self.env_client.close()
        self.engine.shutdown()

    async def _work(self) -> bool:
        """The samples the episodes finished since the last round are held, their metadata goes to the orchestrator
        and their views to their reward ranks (they finished in the turns the loop gave them after it), the env
        ranks' answers come in, and the engine takes one decoding step. True if anything but a send moved."""
        done, failed = self.episodes.take()
        for sample_id in failed:
            del self._reward_rank[sample_id]  # re-queued: its next work names its reward rank
        if done or failed:
            metas = [SampleMeta.of(sample) for sample in done]
            send(self.ctx.world, RolloutDone(metas, failed), self.ctx.orchestrator_rank, Tag.RESULT)
        by_reward_rank: dict[int, list[str]] = {}
        for sample in done:
            self.held[sample.sample_id] = sample
            by_reward_rank.setdefault(self._reward_rank.pop(sample.sample_id), []).append(sample.sample_id)
        for reward_rank, sample_ids in by_reward_rank.items():
            self._send_views(sample_ids, reward_rank)
        env_moved = self.env_client.pump() if self.env_client else False
        episodes_started, self._episodes_started = self._episodes_started, False
        if episodes_started or env_moved:
            await asyncio.sleep(0)  # new episodes and answered env calls submit their turn before the engine steps
        return self._step_engine() or env_moved

    def _activity(self) -> str | None:
        """Busy while it holds episodes and is awake (a decoding step or an env answer is progress), else None;
        each stretch of holding episodes, from the work's arrival, is a ``generate`` span of the timeline."""
        if not self.episodes:
            if self._generating_since is not None:
                timeline.record("generate", self._generating_since, time.time())
                self._generating_since = None
            return None
        if self.engine.asleep:  # episodes wait through the trainer's step: nothing to progress on
            return None
        return f"generating {len(self.episodes)} episode(s) with weights v{self.engine.version}"

    def _idle(self) -> str:
        return "asleep while the trainer steps" if self.episodes and self.engine.asleep else "waiting for episodes"


def run_rollout(
    ctx: RoleContext, cfg: HetrlConfig, model_dir: Path, receiver: Any, crash: Countdown, refuse_push: Countdown
) -> None:
    asyncio.run(RolloutWorker(ctx, cfg, model_dir, receiver, crash, refuse_push).run())
