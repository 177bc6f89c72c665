"""Where a step goes: every rank's spans of work and every control message's hop, on one wall clock.

Each rank appends to ``RUN/timeline/<role>_<n>.jsonl`` (``monitor.timeline``), one JSON object a line:

* a span, ``{"span": "generate", "t0": ..., "t1": ...}``: a phase of this rank's work (the
  orchestrator's ``step``, ``collect batch`` and ``train``; an engine's ``generate``, ``receive
  weights`` and ``reload weights``, and a colocated one's ``sleep``, ``wake weights`` and ``wake
  kv_cache``; the trainer's ``log-probs``, ``train step``, ``push weights``...);
* a hop, ``{"hop": "RolloutDone", "from": 1, "t0": sent, "t1": received}``: a message of the control
  plane (:mod:`hetrl.control.comm` stamps each with its send time), recorded by its receiver when
  it arrived whole: its latency includes the time the receiver took to look.

Times are ``time.time()``: ranks on one node share its clock, nodes are as close as NTP keeps them
(a millisecond or so; a hop's latency across nodes is that good). ``hetrl.plot`` reads the files
back (:func:`read_timeline`) for a Gantt chart of a few steps across roles and a table of the
median seconds per phase. Like the liveness beacon this is process-wide state, set up once per
rank by the worker; before that (tests, tools) every call is a no-op. Writes are buffered and
flushed at most once a second, so a step of tiny_grpo (~40 records) costs microseconds.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from hetrl.control import rundir

_FLUSH_S = 1.0


@dataclass(frozen=True)
class Record:
    """One span or hop, as read back: ``who`` is the rank's file stem (``rollout_0``)."""

    who: str
    name: str
    t0: float
    t1: float
    source: int | None = None  # a hop's sender (world rank); None for a span
    step: int | None = None  # the orchestrator's ``step`` spans: which RL step


class _Writer:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file: IO[str] = open(path, "a", buffering=1 << 16)
        self.flushed = time.monotonic()

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record, separators=(",", ":")) + "\n")
        if time.monotonic() - self.flushed > _FLUSH_S:
            self.file.flush()
            self.flushed = time.monotonic()


_writer: _Writer | None = None


def start(run_dir: Path, role: str, role_rank: int) -> None:
    """Record this process's spans and hops into the run's timeline."""
    global _writer
    _writer = _Writer(Path(run_dir) / rundir.TIMELINE / f"{role}_{role_rank}.jsonl")


def stop() -> None:
    global _writer
    if _writer is not None:
        _writer.file.close()
        _writer = None


def record(name: str, t0: float, t1: float, step: int | None = None) -> None:
    """A span of this rank's work from ``t0`` to ``t1`` (``time.time()``); ``step`` for the orchestrator's ``step``."""
    if _writer is not None:
        _writer.write(
            {"span": name, "t0": t0, "t1": t1} if step is None else {"span": name, "t0": t0, "t1": t1, "step": step}
        )


@contextmanager
def span(name: str) -> Iterator[None]:
    """Record the block as a span (also when it raises: the time was spent)."""
    if _writer is None:
        yield
        return
    t0 = time.time()
    try:
        yield
    finally:
        record(name, t0, time.time())


def hop(kind: str, source: int, sent: float) -> None:
    """A message of type ``kind`` from world rank ``source``, sent at ``sent``, arrived now."""
    if _writer is not None:
        _writer.write({"hop": kind, "from": source, "t0": sent, "t1": time.time()})


def read_timeline(run_dir: Path) -> list[Record]:
    """Every rank's records, in time order (a line cut short by a crash is skipped)."""
    records = []
    for path in sorted((Path(run_dir) / rundir.TIMELINE).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            name = row.get("span") or row.get("hop")
            records.append(Record(path.stem, name, row["t0"], row["t1"], row.get("from"), row.get("step")))
    return sorted(records, key=lambda r: r.t0)


def step_windows(records: list[Record]) -> dict[int, tuple[float, float]]:
    """RL step -> (start, end), from the orchestrator's ``step`` spans."""
    return {r.step: (r.t0, r.t1) for r in records if r.name == "step" and r.step is not None}


def _by_step(records: list[Record], skip_first: int) -> list[list[Record]]:
    """The records of each RL step after the first ``skip_first`` (the first carries start-up costs):
    a record belongs to the step whose window holds its start."""
    windows = sorted(step_windows(records).items())[skip_first:]
    return [[r for r in records if start <= r.t0 < end] for _, (start, end) in windows]


def phase_medians(records: list[Record], skip_first: int = 1) -> dict[str, float]:
    """``who: span`` -> median seconds per RL step spent in it (0 in a step without it)."""
    per_step = []
    for step in _by_step(records, skip_first):
        spent: dict[str, float] = defaultdict(float)
        for r in step:
            if r.source is None:
                spent[f"{r.who}: {r.name}"] += r.t1 - r.t0
        per_step.append(spent)
    phases = sorted({name for spent in per_step for name in spent})
    return {name: statistics.median(spent.get(name, 0.0) for spent in per_step) for name in phases}


def hop_latencies(records: list[Record], skip_first: int = 1) -> dict[str, tuple[float, float]]:
    """``Kind -> who`` -> (median latency of one message in seconds, messages per RL step)."""
    steps = _by_step(records, skip_first)
    latencies: dict[str, list[float]] = defaultdict(list)
    for step in steps:
        for r in step:
            if r.source is not None:
                latencies[f"{r.name} -> {r.who}"].append(r.t1 - r.t0)
    return {hop: (statistics.median(values), len(values) / len(steps)) for hop, values in sorted(latencies.items())}
