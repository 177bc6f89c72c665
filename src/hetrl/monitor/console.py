"""Human-facing progress: a rich live view on a terminal, plain log lines everywhere else.

On a TTY the view holds a progress bar over RL steps with ETA, one compact row of key metrics and a
per-role table (state, tokens/s, seconds since last progress), plus the latest alerts. Under Slurm or
CI (no TTY) a live view would fill the log with redraw escapes, so each step becomes one greppable
line instead: ``step 12/100 | reward/mean=0.41 ... | eta 3m12s``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Protocol

from rich.console import Console as RichConsole
from rich.console import Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from hetrl.monitor.guards import Alert


@dataclass
class RoleStatus:
    """What the console shows per role."""

    role: str
    state: str
    tokens_per_s: float | None
    idle_s: float  # seconds since the role last reported progress


def format_value(value: float | None) -> str:
    """Compact number for a narrow column: 4 significant digits, '-' when absent."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class Console(Protocol):
    def update(self, step: int, metrics: Mapping[str, float], roles: Sequence[RoleStatus]) -> None: ...

    def refresh(self, roles: Sequence[RoleStatus]) -> None: ...

    def alert(self, alert: Alert) -> None: ...

    def close(self) -> None: ...


class _Eta:
    """Remaining time from the mean step time since the first step this process saw (resume-safe)."""

    def __init__(self, total_steps: int):
        self.total_steps = total_steps
        self._first: tuple[int, float] | None = None

    def seconds_left(self, step: int, now: float) -> float | None:
        if self._first is None:
            self._first = (step, now)
            return None
        first_step, first_time = self._first
        done = step - first_step
        return (now - first_time) / done * max(self.total_steps - 1 - step, 0) if done > 0 else None


class PlainConsole:
    """One line per step and per alert, for logs."""

    def __init__(self, total_steps: int, key_metrics: Sequence[str], stream: IO[str]):
        self.total_steps = total_steps
        self.key_metrics = list(key_metrics)
        self.stream = stream
        self._eta = _Eta(total_steps)

    def update(self, step: int, metrics: Mapping[str, float], roles: Sequence[RoleStatus]) -> None:
        parts = [f"step {step + 1}/{self.total_steps}"]
        parts.append(" ".join(f"{k}={format_value(metrics.get(k))}" for k in self.key_metrics if k in metrics))
        rates = " ".join(f"{r.role}={format_value(r.tokens_per_s)}tok/s" for r in roles if r.tokens_per_s is not None)
        if rates:
            parts.append(rates)
        left = self._eta.seconds_left(step, time.monotonic())
        parts.append(f"eta {format_duration(left)}" if left is not None else "eta ?")
        self.stream.write(" | ".join(p for p in parts if p) + "\n")
        self.stream.flush()

    def refresh(self, roles: Sequence[RoleStatus]) -> None:
        """Nothing to redraw in a log."""

    def alert(self, alert: Alert) -> None:
        self.stream.write(f"{alert}\n")
        self.stream.flush()

    def close(self) -> None:
        self.stream.flush()


class LiveConsole:
    """rich Live view: progress bar + key-metrics row + role table + recent alerts."""

    _MAX_ALERTS = 5
    _PAIRS_PER_ROW = 3

    def __init__(self, total_steps: int, key_metrics: Sequence[str], console: RichConsole):
        self.key_metrics = list(key_metrics)
        self._metrics: Mapping[str, float] = {}
        self._roles: Sequence[RoleStatus] = []
        self._alerts: list[Alert] = []
        self._progress = Progress(
            TextColumn("[bold]RL steps"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
        )
        self._task = self._progress.add_task("steps", total=total_steps)
        # print() goes above the view while it is up; stderr is left alone: it carries the libraries'
        # output, which the worker sends to the rank's log unless monitor.verbose says otherwise.
        self._live = Live(self._render(), console=console, refresh_per_second=2, transient=False, redirect_stderr=False)
        self._live.start()

    def _render(self) -> Group:
        # name/value pairs, _PAIRS_PER_ROW per row: long metric names fit an 80-column terminal.
        metrics = Table(box=None, pad_edge=False, show_header=False)
        for _ in range(self._PAIRS_PER_ROW):
            metrics.add_column(style="bold", no_wrap=True)
            metrics.add_column(justify="right", no_wrap=True, min_width=9)
        cells = [c for k in self.key_metrics for c in (k, format_value(self._metrics.get(k)))]
        width = 2 * self._PAIRS_PER_ROW
        for i in range(0, len(cells), width):
            row = cells[i : i + width]
            metrics.add_row(*row, *[""] * (width - len(row)))
        roles = Table("role", "state", "tokens/s", "last progress", box=None, pad_edge=False)
        for r in self._roles:
            roles.add_row(r.role, r.state, format_value(r.tokens_per_s), f"{r.idle_s:.0f}s ago")
        alerts = [Text(str(a), style="bold red" if a.action == "stop" else "yellow") for a in self._alerts]
        return Group(self._progress, metrics, roles, *alerts)

    def update(self, step: int, metrics: Mapping[str, float], roles: Sequence[RoleStatus]) -> None:
        self._metrics, self._roles = dict(metrics), list(roles)
        self._progress.update(self._task, completed=step + 1)
        self._live.update(self._render(), refresh=True)

    def refresh(self, roles: Sequence[RoleStatus]) -> None:
        self._roles = list(roles)
        self._live.update(self._render())

    def alert(self, alert: Alert) -> None:
        self._alerts = (self._alerts + [alert])[-self._MAX_ALERTS :]
        self._live.update(self._render(), refresh=True)

    def close(self) -> None:
        self._live.stop()


def make_console(
    enabled: bool,
    total_steps: int,
    key_metrics: Sequence[str],
    stream: IO[str] | None = None,
    force_terminal: bool | None = None,
) -> Console | None:
    """The live view on a terminal, plain lines otherwise, None when the console is disabled.

    ``stream`` defaults to stdout: a rank's stderr goes to its log (hetrl.launch.worker).
    ``force_terminal`` overrides TTY detection (tests; or a terminal rich cannot detect).
    """
    if not enabled:
        return None
    stream = stream if stream is not None else sys.stdout
    is_tty = stream.isatty() if force_terminal is None else force_terminal
    if is_tty:
        return LiveConsole(total_steps, key_metrics, RichConsole(file=stream, force_terminal=True))
    return PlainConsole(total_steps, key_metrics, stream)
