"""The reward role: scores finished samples with the recipe's rubric, as a stream.

Each :class:`RewardWork` is answered by one :class:`RewardDone` with the same samples, rewards
and flags filled in. The rubric never raises for a hostile sample (a failing source scores 0 with
a flag); if it fails anyway (a verifier process died, a reward-model server broke), the batch
comes back as ``failed`` for the orchestrator to retry and the rubric is rebuilt.
"""

from __future__ import annotations

import logging

from hetrl.config.schema import HetrlConfig
from hetrl.control.comm import RoleContext, Tag, recv, send
from hetrl.loop.faults import Countdown
from hetrl.loop.work import RewardDone, RewardWork, Shutdown

logger = logging.getLogger(__name__)


def run_reward(ctx: RoleContext, cfg: HetrlConfig, crash: Countdown) -> None:
    from hetrl.reward.rubric import Rubric

    rubric = Rubric.from_config(cfg.reward)
    try:
        while True:
            message, source, _ = recv(ctx.world, ctx.orchestrator_rank, Tag.WORK)
            if isinstance(message, Shutdown):
                return
            if not isinstance(message, RewardWork):
                raise TypeError(f"reward worker got an unexpected {type(message).__name__}")
            try:
                if crash.fire():
                    raise RuntimeError("injected fault: the reward scorer crashed")
                done = RewardDone([rubric.score(sample).apply_to(sample) for sample in message.samples])
            except Exception as error:  # noqa: BLE001 - retried elsewhere; the worker carries on
                logger.error("scoring failed (%r): returning %d sample(s) for retry, rebuilding the rubric", error, len(message.samples))
                rubric.close()
                rubric = Rubric.from_config(cfg.reward)
                done = RewardDone([], failed=[s.sample_id for s in message.samples])
            send(ctx.world, done, source, Tag.RESULT)
    finally:
        rubric.close()
