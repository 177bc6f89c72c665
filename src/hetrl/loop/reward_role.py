"""The reward role: scores finished samples with the recipe's rubric, as a stream.

Each :class:`RewardWork` is answered by one :class:`RewardDone` with the same samples, rewards
and flags filled in. The rubric never raises for a hostile sample (a failing source scores 0 with
a flag), so a worker only dies for real faults, and then the job's abort handling applies.
"""

from __future__ import annotations

import logging

from hetrl.config.schema import HetrlConfig
from hetrl.control.comm import RoleContext, Tag, recv, send
from hetrl.loop.work import RewardDone, RewardWork, Shutdown

logger = logging.getLogger(__name__)


def run_reward(ctx: RoleContext, cfg: HetrlConfig) -> None:
    from hetrl.reward.rubric import Rubric

    rubric = Rubric.from_config(cfg.reward)
    try:
        while True:
            message, source, _ = recv(ctx.world, ctx.orchestrator_rank, Tag.WORK)
            if isinstance(message, Shutdown):
                return
            if not isinstance(message, RewardWork):
                raise TypeError(f"reward worker got an unexpected {type(message).__name__}")
            scored = [rubric.score(sample).apply_to(sample) for sample in message.samples]
            send(ctx.world, RewardDone(scored), source, Tag.RESULT)
    finally:
        rubric.close()
