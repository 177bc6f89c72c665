"""Reward records: what one reward function returns and what the rubric makes of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hetrl.records import CONVERSATION_KEY, REWARD_METRICS_KEY, Sample


@dataclass
class RewardValue:
    """One reward function's verdict on one sample: a score plus named flags and metrics."""

    score: float
    flags: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardOutcome:
    """The rubric's verdict: the weighted ``total`` the advantage uses, raw values per source."""

    total: float
    per_source: dict[str, float] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    def apply_to(self, sample: Sample) -> Sample:
        """Write the outcome into the shared record (rewards, reward, flags, the functions' metrics)."""
        sample.rewards = dict(self.per_source)
        sample.reward = self.total
        sample.flags = sorted(set(sample.flags) | set(self.flags))
        sample.info[REWARD_METRICS_KEY] = dict(self.metrics)
        return sample


RewardFn = Callable[[Sample], "float | RewardValue"]


class ScoringUnavailable(RuntimeError):
    """A source could not score for a reason outside the sample: its served judge or reward model did not
    answer. The rubric lets it through (a 0 would be a verdict the sample did not earn), and the reward
    role returns the sample to the orchestrator to be scored again."""


def as_value(result: float | RewardValue) -> RewardValue:
    if isinstance(result, RewardValue):
        return result
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        raise TypeError(f"a reward function must return a float or RewardValue, got {type(result).__name__}")
    return RewardValue(float(result))


def conversation(sample: Sample) -> list[dict[str, str]]:
    """The episode as text chat messages: what a judge or a reward model reads.

    The episode runner records it; a sample made elsewhere falls back to its decoded prompt and
    completion (chat-template markup included).
    """
    messages = sample.info.get(CONVERSATION_KEY)
    if messages:
        return messages
    return [{"role": "user", "content": sample.prompt_text}, {"role": "assistant", "content": sample.completion_text}]


def prompt_and_response(sample: Sample) -> tuple[str, str]:
    """What was asked (every message before the policy's first turn) and what the policy answered:
    its turn, or for a multi-turn episode the rest of the conversation with each message's role."""
    messages = conversation(sample)
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    asked, answered = messages[:first], messages[first:]
    prompt = "\n\n".join(m["content"] for m in asked)
    if len(answered) == 1:
        return prompt, answered[0]["content"]
    return prompt, "\n\n".join(f"[{m['role']}] {m['content']}" for m in answered)


def policy_text(sample: Sample) -> str:
    """What the policy itself wrote: its turns only (a tool's output or a file's content is not its doing)."""
    return "\n\n".join(m["content"] for m in conversation(sample) if m["role"] == "assistant")
