"""The reward role: scores finished samples with the recipe's rubric, many at once, as a stream.

Each :class:`RewardWork` comes from the engine that generated its samples (the orchestrator named this
rank to it) and carries what the rubric reads of them (``ScoringView``: texts, answer, length, the
environment's rewards; never routing arrays, images, log-probs or versions); it is answered, to the
orchestrator, by :class:`RewardDone` messages carrying the verdicts (``ScoredSample``: rewards per source, total, flags,
metrics), sent as they finish (``hetrl.reward.worker.ConcurrentScorer``: ``reward.workers`` samples at a
time, so code tests run side by side on the sandbox pool and judge and reward-model requests are in flight
together), with the wall time the worker was busy since its previous answer (the orchestrator turns it into
``time/reward``). The rubric never raises, not for a hostile sample nor for a served model that never
answered (each scores 0 with a flag); if scoring fails anyway (the injected ``scorer_crash``, a broken
rubric), those samples come back as ``failed`` for the orchestrator to retry a bounded number of times
(``hetrl.loop.orchestrator.MAX_SCORING_FAILURES``), and the rubric is rebuilt.

Served models: when the rubric uses the judge or the reward model, they live on the
reward_server ranks (``hetrl.loop.reward_server_role``); this rank's main thread -- the only one
that touches MPI -- pumps their client between polls for work: its rounds are
``hetrl.control.role_loop.RoleLoop``'s, a handler per message (``RewardWork``, ``Shutdown``), then the
pump and the answers as the role's own work.
"""

from __future__ import annotations

import logging
import threading
import time

from hetrl.config.schema import HetrlConfig
from hetrl.control import liveness, timeline
from hetrl.control.comm import RoleContext, Tag, send
from hetrl.control.protocol import RewardDone, RewardWork, ScoredSample, Shutdown
from hetrl.control.role_loop import RoleLoop
from hetrl.loop import faults
from hetrl.loop.faults import RankFaults
from hetrl.loop.reward_server_role import RewardServerClient
from hetrl.reward.rubric import Rubric
from hetrl.reward.worker import ConcurrentScorer

logger = logging.getLogger(__name__)


class _RiggedFaults:
    """The reward worker's injected misbehaviours besides a crash (see hetrl.loop.faults)."""

    def __init__(self, rank_faults: RankFaults) -> None:
        self.drop = rank_faults.onset("reward_drop")

    def after_scoring(self, scored: ScoredSample) -> ScoredSample:
        if self.drop.fire():
            scored.reward -= faults.REWARD_DROP
        return scored


class RewardRank:
    """One reward worker: takes the engines' work, scores it concurrently, streams the verdicts to the orchestrator."""

    def __init__(self, ctx: RoleContext, cfg: HetrlConfig, rank_faults: RankFaults) -> None:
        self.ctx, self.cfg = ctx, cfg
        self.crash = rank_faults.countdown("scorer_crash")
        self.rigged = _RiggedFaults(rank_faults)
        self.wake = threading.Event()  # a sample finished or a scoring thread asked a reward server: the nap ends
        server = cfg.reward.server
        self.client = (
            RewardServerClient(ctx, server.request_timeout_s, server.max_attempts, self.wake)
            if cfg.reward.served_models
            else None
        )
        self.scorer = self._new_scorer()
        # Scorers of a failed rubric whose samples in flight still finish and are answered.
        self.retiring: list[ConcurrentScorer] = []
        self.busy_since: float | None = None  # wall time charged to the next answer starts here
        self.loop = RoleLoop(
            ctx,
            {RewardWork: self._take_work, Shutdown: self._on_shutdown},  # work from any engine
            wake=self.wake,
        )

    def _new_scorer(self) -> ConcurrentScorer:
        resources = {"reward_server": self.client, "judge_config": self.cfg.reward.judge} if self.client else {}
        rubric = Rubric.from_config(self.cfg.reward, resources)
        return ConcurrentScorer(rubric, self.cfg.reward.workers, self.wake)

    def run(self) -> None:
        """Rounds of the role loop until Shutdown: the engines' work, the reward servers' answers, the verdicts
        that finished. A round that moved nothing naps (``comm.naps``), or until a scoring thread's wake-up."""
        try:
            self.loop.run(work=self._work, activity=self._activity, idle="waiting for samples to score")
        finally:
            if self.client is not None:
                self.client.close()  # first: it fails what the scoring threads wait for, so they finish now
            for scorer in [self.scorer, *self.retiring]:
                scorer.close()

    def _work(self) -> bool:
        if self.loop.stop:  # the orchestrator is done: it wants no more answers
            return False
        moved = self.client.pump() if self.client is not None else False
        return self._answer() or moved

    def _activity(self) -> str | None:
        return f"scoring {self.in_flight} sample(s)" if self.in_flight else None

    def _on_shutdown(self, message: Shutdown, source: int) -> None:
        self.loop.stop = True

    @property
    def in_flight(self) -> int:
        return self.scorer.in_flight + sum(scorer.in_flight for scorer in self.retiring)

    def _take_work(self, message: RewardWork, source: int) -> None:
        if self.busy_since is None:
            self.busy_since = time.monotonic()
        if self.crash.fire():
            self._fail([view.sample_id for view in message.views], RuntimeError("injected fault: the scorer crashed"))
            return
        for view in message.views:
            self.scorer.submit(view)

    def _answer(self) -> bool:
        """Send what finished since the last round. A failed sample means the rubric broke (a served model that never
        answered is a verdict, not a failure): it retires, a new one scores what comes next."""
        done, failed = [], []
        for scorer in [*self.retiring, self.scorer]:
            idle = scorer is not self.scorer and not scorer.in_flight  # read before finished(): nothing can come after
            finished, lost = scorer.finished()
            done += finished
            failed += lost
            if scorer is self.scorer and lost:
                self._rebuild(lost[0][1], len(lost))
            if idle:
                self.retiring.remove(scorer)
                scorer.close()
        if not done and not failed:
            return False
        self._send(
            RewardDone([self.rigged.after_scoring(s) for s in done], failed=[sample_id for sample_id, _ in failed])
        )
        liveness.tick()
        return True

    def _fail(self, sample_ids: list[str], error: BaseException) -> None:
        self._rebuild(error, len(sample_ids))
        self._send(RewardDone([], failed=sample_ids))

    def _rebuild(self, error: BaseException, num_failed: int) -> None:
        """A new rubric for what comes next. The old one retires without blocking this thread: its samples in
        flight may wait on the reward servers, whose answers only this thread's pump delivers."""
        logger.error("scoring failed (%r): returning %d sample(s) for retry, rebuilding the rubric", error, num_failed)
        self.retiring.append(self.scorer)
        self.scorer = self._new_scorer()

    def _send(self, done: RewardDone) -> None:
        now, t0 = time.monotonic(), time.time()
        start = self.busy_since if self.busy_since is not None else now
        done.score_s = now - start
        timeline.record("score", t0 - done.score_s, t0)
        self.busy_since = now if self.in_flight else None
        send(self.ctx.world, done, self.ctx.orchestrator_rank, Tag.RESULT)


def run_reward(ctx: RoleContext, cfg: HetrlConfig, rank_faults: RankFaults) -> None:
    RewardRank(ctx, cfg, rank_faults).run()
