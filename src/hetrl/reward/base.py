"""Reward records: what one reward function returns and what the rubric makes of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from hetrl.types import Sample


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
        """Write the outcome into the shared record (rewards, reward, flags)."""
        sample.rewards = dict(self.per_source)
        sample.reward = self.total
        sample.flags = sorted(set(sample.flags) | set(self.flags))
        return sample


RewardFn = Callable[[Sample], "float | RewardValue"]


def as_value(result: float | RewardValue) -> RewardValue:
    if isinstance(result, RewardValue):
        return result
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        raise TypeError(f"a reward function must return a float or RewardValue, got {type(result).__name__}")
    return RewardValue(float(result))
