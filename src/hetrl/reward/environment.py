"""The environment's own verdict as a reward source: ``reward.functions: [{name: env}]``.

Environments that judge an episode themselves (``screen`` and ``terminal`` check the final state
of the window or file system, which only the trusted side sees) return rewards from ``step``; the
episode runner sums them into ``Sample.rewards["env"]``. The rubric rebuilds ``Sample.rewards``
from its functions, so that verdict counts only through this one.
"""

from __future__ import annotations

from hetrl.records import ENV_REWARD_KEY
from hetrl.reward.base import RewardValue, Scorable


class EnvironmentReward:
    """The episode's environment reward; an episode its environment never scored gets 0, flagged."""

    def __call__(self, sample: Scorable) -> RewardValue:
        if ENV_REWARD_KEY not in sample.rewards:
            return RewardValue(0.0, flags=["reward/env_unscored"], metrics={"env/unscored_frac": 1.0})
        return RewardValue(float(sample.rewards[ENV_REWARD_KEY]), metrics={"env/unscored_frac": 0.0})
