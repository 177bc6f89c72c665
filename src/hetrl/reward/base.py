"""Reward records: what one reward function returns and what the rubric makes of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hetrl.control.protocol import ScoredSample, ScoringView
from hetrl.records import CONVERSATION_KEY, Sample

Scorable = Sample | ScoringView  # a whole sample (evaluation, benches) or what a reward rank is sent of one


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

    def verdict(self, sample_id: str) -> ScoredSample:
        """The outcome as a reward rank sends it back."""
        return ScoredSample(sample_id, dict(self.per_source), self.total, list(self.flags), dict(self.metrics))

    def apply_to(self, sample: Sample) -> Sample:
        """Write the outcome into the shared record (rewards, reward, flags, the functions' metrics)."""
        return self.verdict(sample.sample_id).apply_to(sample)


RewardFn = Callable[[Scorable], "float | RewardValue"]


class ScoringUnavailable(RuntimeError):
    """A source could not score for a reason outside the sample: its served judge or reward model did not
    answer within ``reward.server.max_attempts`` tries. The rubric scores the sample 0, flagged
    ``reward/unavailable:<source>`` (hetrl.reward.rubric): it is never sent again."""


def as_value(result: float | RewardValue) -> RewardValue:
    if isinstance(result, RewardValue):
        return result
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        raise TypeError(f"a reward function must return a float or RewardValue, got {type(result).__name__}")
    return RewardValue(float(result))


def completion_tokens(sample: Scorable) -> int:
    """Tokens of the completion (environment turns included): a view counts them, it carries no ids by default."""
    return sample.num_completion_tokens if isinstance(sample, ScoringView) else len(sample.completion_ids)


def conversation(sample: Scorable) -> list[dict[str, str]]:
    """The episode as text chat messages: what a judge or a reward model reads.

    The episode runner records it; a sample made elsewhere falls back to its decoded prompt and
    completion (chat-template markup included).
    """
    messages = sample.info.get(CONVERSATION_KEY)
    if messages:
        return messages
    return [{"role": "user", "content": sample.prompt_text}, {"role": "assistant", "content": sample.completion_text}]


def prompt_and_response(sample: Scorable) -> tuple[str, str]:
    """What was asked (every message before the policy's first turn) and what the policy answered:
    its turn, or for a multi-turn episode the rest of the conversation with each message's role."""
    messages = conversation(sample)
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    asked, answered = messages[:first], messages[first:]
    prompt = "\n\n".join(m["content"] for m in asked)
    if len(answered) == 1:
        return prompt, answered[0]["content"]
    return prompt, "\n\n".join(f"[{m['role']}] {m['content']}" for m in answered)


def policy_text(sample: Scorable) -> str:
    """What the policy itself wrote: its turns only (a tool's output or a file's content is not its doing)."""
    return "\n\n".join(m["content"] for m in conversation(sample) if m["role"] == "assistant")
