"""The run's monitor: one object the loop's controller process feeds, fanning out to every sink.

Ownership: exactly one :class:`Monitor` per run, in the process that drives the RL loop. Other
roles send their numbers to it (over the control plane) and the controller calls :meth:`log`;
role liveness arrives as :meth:`progress` calls. Per step, :meth:`end_step` validates and writes
the collected metrics to JSONL + TensorBoard (+ W&B), refreshes the console, runs the guards and
raises :class:`~hetrl.monitor.guards.GuardStop` if a ``stop`` guard fired -- after the step is
durable on disk, so the evidence survives. Steps may overlap (async schedules log step k+1's
rollouts before step k is trained), so metrics are buffered per step until its ``end_step``.

Run-directory layout written here: ``metrics.jsonl``, ``alerts.jsonl``, ``tensorboard/``. The rollouts
(``rollouts/*.h5``, ``monitor.rollout_store``) are stored by the trainer replicas that train on them
(``hetrl.loop.trainer_role``): the payloads never reach this process.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

from hetrl.config.monitor import MonitorConfig
from hetrl.monitor import names
from hetrl.monitor.console import Console, RoleStatus, make_console
from hetrl.monitor.guards import Alert, Guards, GuardStop
from hetrl.monitor.metrics import rollout_metrics
from hetrl.monitor.sinks import METRICS_FILE, TENSORBOARD_DIR, JsonlSink, Sink, TensorBoardSink, build_wandb_sink
from hetrl.records import SampleMeta

ALERTS_FILE = "alerts.jsonl"
log = logging.getLogger(__name__)


class _RoleTracker:
    """Last progress time, state and token count per role since the previous step boundary."""

    def __init__(self, roles: Sequence[str], now: float):
        self.last_progress: dict[str, float] = {r: now for r in roles}
        self.state: dict[str, str] = {r: "starting" for r in roles}
        self.tokens: dict[str, int] = {}
        self.rates: dict[str, float] = {}
        self._mark = now

    def progress(self, role: str, tokens: int, state: str | None, now: float) -> None:
        self.last_progress[role] = now
        if state is not None:
            self.state[role] = state
        self.state.setdefault(role, "running")
        if tokens:
            self.tokens[role] = self.tokens.get(role, 0) + tokens

    def take_rates(self, now: float) -> dict[str, float]:
        """Tokens/s per role since the previous call; roles that reported no tokens are left out."""
        elapsed = max(now - self._mark, 1e-9)
        self.rates = {role: n / elapsed for role, n in self.tokens.items()}
        self.tokens, self._mark = {}, now
        return self.rates

    def statuses(self, now: float) -> list[RoleStatus]:
        return [
            RoleStatus(r, self.state.get(r, "?"), self.rates.get(r), now - t)
            for r, t in sorted(self.last_progress.items())
        ]


class Monitor:
    """Metrics, console and guards of one run (see module docstring)."""

    def __init__(
        self,
        cfg: MonitorConfig,
        run_dir: str | Path,
        total_steps: int,
        roles: Sequence[str] = (),
        run_config: Mapping[str, Any] | None = None,
        stream: IO[str] | None = None,
        force_terminal: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        for name in cfg.console_metrics:
            names.check_name(name)
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self.sinks: list[Sink] = [JsonlSink(self.run_dir / METRICS_FILE)]
        if cfg.tensorboard:
            self.sinks.append(TensorBoardSink(self.run_dir / TENSORBOARD_DIR))
        wandb_sink = build_wandb_sink(cfg.wandb, self.run_dir, run_config)
        if wandb_sink is not None:
            self.sinks.append(wandb_sink)
        self.guards = Guards(cfg.guards)
        self.console: Console | None = make_console(
            cfg.console, total_steps, cfg.console_metrics, stream, force_terminal
        )
        self._alerts_fh = (self.run_dir / ALERTS_FILE).open("a", encoding="utf-8")
        now = clock()
        self._roles = _RoleTracker(roles, now)
        self._pending: dict[int, dict[str, float]] = {}
        self._last_step_end = now

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Add metrics to a step (validated against the documented names; later values win)."""
        bucket = self._pending.setdefault(int(step), {})
        for name, value in metrics.items():
            bucket[names.check_name(name)] = float(value)

    def record_rollouts(self, step: int, samples: Sequence[SampleMeta]) -> dict[str, float]:
        """Log the rollout metrics of the samples a step trained on (their metadata); returns what it logged.

        The engine-vs-trainer mismatch comes with the trainer's metrics (only the trainer holds both log-probs).
        """
        metrics = dict(rollout_metrics(samples))
        self.log(step, metrics)
        return metrics

    @contextmanager
    def timer(self, step: int, phase: str) -> Iterator[None]:
        """Accumulate the wall time of the block into ``time/<phase>`` of ``step``."""
        name = names.time_phase(phase)
        start = self._clock()
        try:
            yield
        finally:
            bucket = self._pending.setdefault(int(step), {})
            bucket[name] = bucket.get(name, 0.0) + self._clock() - start

    def progress(self, role: str, tokens: int = 0, state: str | None = None) -> None:
        """A role made progress or changed state (optionally: tokens processed since its last call).

        The state (e.g. :data:`~hetrl.monitor.guards.IDLE`, waiting for work) and the time since the
        last progress are shown on the console; hangs are the liveness watchdog's (docs/hangs.md).
        """
        names.throughput(role)  # validates the role name early
        self._roles.progress(role, int(tokens), state, self._clock())

    def poll(self) -> None:
        """Redraw the console (role states, seconds since their last progress); call it while waiting on roles."""
        if self.console is not None:
            self.console.refresh(self._roles.statuses(self._clock()))

    def end_step(self, step: int) -> dict[str, float]:
        """Write the step's metrics everywhere, run the guards; raise GuardStop on a ``stop`` alert."""
        now = self._clock()
        metrics = self._pending.pop(int(step), {})
        for role, rate in self._roles.take_rates(now).items():
            metrics.setdefault(names.throughput(role), rate)
        metrics.setdefault(names.TIME_STEP, now - self._last_step_end)
        self._last_step_end = now
        for sink in self.sinks:
            sink.write(step, metrics)
        if self.console is not None:
            self.console.update(step, metrics, self._roles.statuses(now))
        self._emit(self.guards.check(step, metrics))
        return metrics

    def _emit(self, alerts: list[Alert]) -> None:
        for alert in alerts:
            self._alerts_fh.write(json.dumps(asdict(alert)) + "\n")
            self._alerts_fh.flush()
            if self.console is not None:
                self.console.alert(alert)
            else:
                log.warning("%s", alert)
        stops = [a for a in alerts if a.action == "stop"]
        if stops:
            raise GuardStop(stops)

    def close(self) -> None:
        """Flush and close every sink and the console (idempotent)."""
        for sink in self.sinks:
            sink.close()
        self.sinks = []
        if self.console is not None:
            self.console.close()
            self.console = None
        if not self._alerts_fh.closed:
            self._alerts_fh.close()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
