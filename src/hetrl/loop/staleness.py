"""The staleness bound of a step, and its adaptive form (``schedule.adaptive_staleness``).

A fixed schedule's bound is a constant: 0 for ``sync``, ``schedule.max_staleness`` for
``one_step_off`` and ``async``. With ``schedule.adaptive_staleness.enabled`` (``async`` only) the
bound floats between ``min_staleness`` (the floor) and ``max_staleness`` (the ceiling) so that a
measured mismatch ``m`` of each RL step (``metric``: ``mismatch/k3_kl``, ``is/truncated_frac`` or
``is/masked_frac``; each grows with the policy lag of the trained samples) stays under ``target``.
It starts at the ceiling; after each RL step, with ``b`` the bound that step's batch was held to:

* ``m > target`` (or ``m`` not finite): multiplicative decrease, ``b <- max(floor, b // 2)``,
  and the calm count is reset;
* ``m <= grow_below x target``: the step is calm; after ``patience`` calm steps in a row,
  additive increase, ``b <- min(ceiling, b + 1)``, and the count starts again;
* in between (the hysteresis band): ``b`` holds and the calm count is reset;
* a step that did not report the metric (no policy token) holds ``b`` and the count.

The decrease is fast and the increase slow and conditional (AIMD, as TCP's congestion window):
one step over the target is enough to cut the lag, a run of clearly calm steps is needed to let it
grow, and the band between ``grow_below x target`` and ``target`` keeps the bound from flapping.

This module holds only the rule. The orchestrator (hetrl.loop.orchestrator) applies the bound to
both the look-ahead of its dispatch and the filter of the next batch, so lowering it never loses a
sample silently: groups already generated beyond the new bound meet ``schedule.stale_policy``
(dropped or generated again, counted in ``staleness/dropped`` and ``staleness/regenerated``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hetrl.config.loop import AdaptiveStalenessConfig, ScheduleConfig

logger = logging.getLogger(__name__)


@dataclass
class AdaptiveBound:
    """The AIMD rule with hysteresis of the module docstring; :meth:`update` once per RL step."""

    metric: str
    target: float
    floor: int
    ceiling: int
    grow_below: float = 0.5
    patience: int = 3

    def __post_init__(self) -> None:
        assert 0 <= self.floor < self.ceiling, (self.floor, self.ceiling)  # refused in the config before
        self.bound = self.ceiling
        self.calm_steps = 0

    @classmethod
    def from_config(cls, cfg: AdaptiveStalenessConfig, ceiling: int) -> AdaptiveBound:
        return cls(cfg.metric, cfg.target, cfg.min_staleness, ceiling, cfg.grow_below, cfg.patience)

    def update(self, value: float | None) -> int:
        """Take one step's measured ``value`` of the metric (None: not reported); the bound of the next step."""
        if value is None:
            return self.bound
        before = self.bound
        if not math.isfinite(value) or value > self.target:
            self.bound, self.calm_steps = max(self.floor, self.bound // 2), 0
        elif value <= self.grow_below * self.target:
            self.calm_steps += 1
            if self.calm_steps >= self.patience:
                self.bound, self.calm_steps = min(self.ceiling, self.bound + 1), 0
        else:
            self.calm_steps = 0
        if self.bound != before:
            logger.info(
                "staleness bound %d -> %d: %s %.4g vs target %.4g", before, self.bound, self.metric, value, self.target
            )
        return self.bound

    def observe(self, metrics: Mapping[str, float]) -> int:
        """:meth:`update` with the step's value of the metric from ``metrics`` (absent: held)."""
        value = metrics.get(self.metric)
        return self.update(None if value is None else float(value))

    def state_dict(self) -> dict[str, int]:
        return {"bound": self.bound, "calm_steps": self.calm_steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a checkpoint's bound, clamped to this run's limits (a resume may change them)."""
        self.bound = min(self.ceiling, max(self.floor, int(state["bound"])))
        self.calm_steps = int(state["calm_steps"])


def fixed_bound(schedule: ScheduleConfig) -> int:
    """The bound of a schedule without adaptation (the ceiling of an adaptive one)."""
    return 0 if schedule.type == "sync" else schedule.max_staleness


def look_ahead(schedule: ScheduleConfig, bound: int) -> int:
    """Steps of generation dispatch may run ahead of training: 0 (sync), 1 (one_step_off), the bound (async)."""
    return {"sync": 0, "one_step_off": 1, "async": bound}[schedule.type]


def build_adaptive_bound(schedule: ScheduleConfig) -> AdaptiveBound | None:
    """The schedule's adaptive bound, or None when its bound is fixed."""
    if not schedule.adaptive_staleness.enabled:
        return None
    return AdaptiveBound.from_config(schedule.adaptive_staleness, ceiling=schedule.max_staleness)
