"""Alerts that catch a run going wrong early, each configured to ``warn`` or ``stop``.

The guards watch the per-step metrics (see :mod:`hetrl.monitor.names`):

* ``nonfinite_loss``: any ``loss/*`` or ``grad_norm`` is NaN/inf (fires every such step).
* ``reward_collapse``: the moving average of ``reward/mean`` over ``window`` steps is more than
  ``max_drop`` below its best so far (fires when entering the collapsed state, re-arms on recovery).
* ``entropy_collapse``: ``entropy`` below ``min_entropy`` for ``patience`` consecutive steps
  (fires once per run of low steps).
* ``mismatch_spike``: ``mismatch/k3_kl`` above ``max_k3_kl``, or above ``spike_factor`` times its
  median over the previous ``window`` steps (fires every such step).

Hangs (a rank that stops answering or makes no progress) are the liveness watchdog's job, not a
guard's: see :mod:`hetrl.control.liveness` and docs/hangs.md.

A guard whose metric is absent in a step skips that step: roles log at different times, and a
missing metric is not evidence of a problem. Guards only *report*; :class:`hetrl.monitor.Monitor`
turns a ``stop`` alert into :class:`GuardStop` after the step is logged, so the evidence is on disk.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from hetrl.config.monitor import GuardsConfig
from hetrl.monitor import names

# Below this (nats per token) engine/trainer disagreement is kernel-level noise; a relative spike
# from ~0 to just above it is not worth an alert.
_MISMATCH_NOISE_FLOOR = 1e-4
#: The role state meaning "waiting for work", as the orchestrator reports it and the console shows it.
IDLE = "idle"


@dataclass(frozen=True)
class Alert:
    guard: str
    action: str  # "warn" | "stop"
    message: str
    step: int | None = None

    def __str__(self) -> str:
        where = f"step {self.step}: " if self.step is not None else ""
        return f"[{self.action.upper()}] {self.guard}: {where}{self.message}"


class GuardStop(RuntimeError):
    """Raised by the monitor when a ``stop`` guard fired; carries the alerts."""

    def __init__(self, alerts: list[Alert]):
        self.alerts = alerts
        super().__init__("run stopped by guard(s): " + "; ".join(str(a) for a in alerts))


class Guards:
    """Stateful checks over the stream of step metrics."""

    def __init__(self, cfg: GuardsConfig):
        self.cfg = cfg
        self._rewards: deque[float] = deque(maxlen=cfg.reward_collapse.window)
        self._best_reward_avg = -math.inf
        self._reward_collapsed = False
        self._low_entropy_steps = 0
        self._mismatch: deque[float] = deque(maxlen=cfg.mismatch_spike.window)

    def check(self, step: int, metrics: Mapping[str, float]) -> list[Alert]:
        """Alerts raised by one step's metrics (updates the guards' history)."""
        alerts: list[Alert] = []
        for check in (self._nonfinite, self._reward_collapse, self._entropy_collapse, self._mismatch_spike):
            alert = check(metrics)
            if alert is not None:
                alerts.append(Alert(alert[0], alert[1], alert[2], step))
        return alerts

    def _nonfinite(self, metrics: Mapping[str, float]) -> tuple[str, str, str] | None:
        cfg = self.cfg.nonfinite_loss
        if not cfg.enabled:
            return None
        bad = sorted(
            k for k, v in metrics.items() if (k.startswith("loss/") or k == names.GRAD_NORM) and not math.isfinite(v)
        )
        if not bad:
            return None
        return "nonfinite_loss", cfg.action, "non-finite " + ", ".join(f"{k}={metrics[k]}" for k in bad)

    def _reward_collapse(self, metrics: Mapping[str, float]) -> tuple[str, str, str] | None:
        cfg = self.cfg.reward_collapse
        value = metrics.get(names.REWARD_MEAN)
        if not cfg.enabled or value is None or not math.isfinite(value):
            return None
        self._rewards.append(value)
        if len(self._rewards) < cfg.window:
            return None
        avg = sum(self._rewards) / len(self._rewards)
        self._best_reward_avg = max(self._best_reward_avg, avg)
        collapsed = self._best_reward_avg - avg > cfg.max_drop
        fire = collapsed and not self._reward_collapsed
        self._reward_collapsed = collapsed
        if not fire:
            return None
        return (
            "reward_collapse",
            cfg.action,
            (
                f"{cfg.window}-step mean reward {avg:.4g} is {self._best_reward_avg - avg:.4g} below its best "
                f"{self._best_reward_avg:.4g}"
                f" (max_drop {cfg.max_drop})"
            ),
        )

    def _entropy_collapse(self, metrics: Mapping[str, float]) -> tuple[str, str, str] | None:
        cfg = self.cfg.entropy_collapse
        value = metrics.get(names.ENTROPY)
        if not cfg.enabled or value is None:
            return None
        self._low_entropy_steps = self._low_entropy_steps + 1 if value < cfg.min_entropy else 0
        if self._low_entropy_steps != cfg.patience:
            return None
        return "entropy_collapse", cfg.action, f"entropy {value:.4g} below {cfg.min_entropy} for {cfg.patience} steps"

    def _mismatch_spike(self, metrics: Mapping[str, float]) -> tuple[str, str, str] | None:
        cfg = self.cfg.mismatch_spike
        value = metrics.get(names.MISMATCH_K3_KL)
        if not cfg.enabled or value is None:
            return None
        history = list(self._mismatch)
        self._mismatch.append(value)
        if not math.isfinite(value) or value > cfg.max_k3_kl:
            return "mismatch_spike", cfg.action, f"mismatch/k3_kl {value:.4g} above max_k3_kl {cfg.max_k3_kl}"
        if cfg.spike_factor is not None and len(history) == cfg.window and value > _MISMATCH_NOISE_FLOOR:
            median = statistics.median(history)
            if value > cfg.spike_factor * median:
                return (
                    "mismatch_spike",
                    cfg.action,
                    (
                        f"mismatch/k3_kl {value:.4g} is over {cfg.spike_factor}x its {cfg.window}-step median "
                        f"{median:.4g}"
                    ),
                )
        return None
