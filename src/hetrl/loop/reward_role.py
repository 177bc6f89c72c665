"""The reward role: scores finished samples with the recipe's rubric, as a stream.

Each :class:`RewardWork` is answered by one :class:`RewardDone` with the same samples, rewards
and flags filled in, and the wall time the scoring took (the orchestrator turns it into
``time/reward``). The rubric never raises for a hostile sample (a failing source scores 0 with
a flag); if it fails anyway (a verifier process died, a reward-model server broke), the batch
comes back as ``failed`` for the orchestrator to retry and the rubric is rebuilt.
"""

from __future__ import annotations

import logging
import time

from hetrl.config.schema import HetrlConfig
from hetrl.control import liveness, timeline
from hetrl.control.comm import RoleContext, Tag, recv, send
from hetrl.loop import faults
from hetrl.loop.faults import Countdown, Onset
from hetrl.loop.work import RewardDone, RewardWork, Shutdown
from hetrl.types import Sample

logger = logging.getLogger(__name__)


class _RiggedFaults:
    """The reward worker's injected misbehaviours besides a crash (see hetrl.loop.faults)."""

    def __init__(self, role_rank: int) -> None:
        found = faults.from_env()
        self.drop = Onset(found, "reward", role_rank, "reward_drop")

    def after_scoring(self, sample: Sample) -> Sample:
        if self.drop.fire():
            sample.reward -= faults.REWARD_DROP
        return sample


def run_reward(ctx: RoleContext, cfg: HetrlConfig, crash: Countdown) -> None:
    from hetrl.reward.rubric import Rubric

    rubric = Rubric.from_config(cfg.reward)
    rigged = _RiggedFaults(ctx.assignment.role_rank)
    try:
        while True:
            liveness.idle("waiting for samples to score")
            message, source, _ = recv(ctx.world, ctx.orchestrator_rank, Tag.WORK)
            if isinstance(message, Shutdown):
                return
            if not isinstance(message, RewardWork):
                raise TypeError(f"reward worker got an unexpected {type(message).__name__}")
            liveness.busy(f"scoring {len(message.samples)} sample(s)")
            start, t0 = time.monotonic(), time.time()
            try:
                if crash.fire():
                    raise RuntimeError("injected fault: the reward scorer crashed")
                done = RewardDone([rigged.after_scoring(_scored(rubric, sample)) for sample in message.samples])
            except Exception as error:  # noqa: BLE001 - retried elsewhere; the worker carries on
                logger.error("scoring failed (%r): returning %d sample(s) for retry, rebuilding the rubric", error, len(message.samples))
                rubric.close()
                rubric = Rubric.from_config(cfg.reward)
                done = RewardDone([], failed=[s.sample_id for s in message.samples])
            done.score_s = time.monotonic() - start
            timeline.record("score", t0, time.time())
            send(ctx.world, done, source, Tag.RESULT)
    finally:
        rubric.close()


def _scored(rubric, sample: Sample) -> Sample:  # noqa: ANN001 - hetrl.reward.rubric.Rubric
    scored = rubric.score(sample).apply_to(sample)
    liveness.tick()
    return scored
