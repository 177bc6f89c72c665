"""The `env` reward source: the environment's own verdict reaches the total, through the rubric."""

from __future__ import annotations

from hetrl.config.reward import RewardConfig
from hetrl.records import Sample
from hetrl.reward.rubric import Rubric


def _sample(rewards: dict[str, float]) -> Sample:
    return Sample("s0", "g0", "screen_tasks", [1, 2], [3], [1], [0.0], [0], rewards=dict(rewards))


def test_env_verdict_is_the_reward_and_survives_a_rescore():
    rubric = Rubric.from_config(RewardConfig(functions=[{"name": "env"}, {"name": "repetition", "weight": 0.0}]))
    scored = rubric.score(_sample({"env": 1.0})).apply_to(_sample({"env": 1.0}))
    assert scored.reward == 1.0 and scored.rewards["env"] == 1.0 and not scored.flags
    again = rubric.score(scored)  # a sample scored again (reward retry) keeps the environment's verdict
    assert again.total == 1.0


def test_an_unscored_episode_gets_zero_and_a_flag():
    outcome = Rubric.from_config(RewardConfig(functions=[{"name": "env"}])).score(_sample({}))
    assert (
        outcome.total == 0.0 and "reward/env_unscored" in outcome.flags and outcome.metrics["env/unscored_frac"] == 1.0
    )
