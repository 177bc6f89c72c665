"""A served sequence-classification reward model as a reward function.

The model lives on the reward_server ranks (``hetrl.reward.serving.RewardModelScorer``, configured
by ``reward.reward_model``); this function sends it the episode's conversation (text chat
messages) and gets back logit 0 of its classification head. Many samples ask at once from the reward worker's
scoring threads, and the server scores everything that arrived together, in batches.

A reward model is a learned proxy: a policy can raise its score without getting better (and a
small one is easy to please). Keep a verifiable source beside it, at weight 0 if need be, and
watch ``hack/proxy_corr`` (docs/metrics.md).
"""

from __future__ import annotations

from typing import Protocol

from hetrl.reward.base import RewardValue, Scorable, conversation


class RewardModelServer(Protocol):
    def reward_model(self, messages: list[dict[str, str]]) -> float: ...


class RewardModelReward:
    """Reward function: the served reward model's score of the episode's conversation, times ``scale``."""

    def __init__(self, reward_server: RewardModelServer, scale: float = 1.0) -> None:
        self.server = reward_server
        self.scale = scale

    def __call__(self, sample: Scorable) -> RewardValue:
        return RewardValue(self.scale * self.server.reward_model(conversation(sample)))
