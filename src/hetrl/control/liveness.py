"""Liveness: every rank's heartbeat and progress, read by a watchdog outside the MPI job.

No hang is silent. Each rank runs a :class:`Beacon`, a daemon thread that every ``beat_s`` seconds
rewrites ``RUN/hang/beats/rank_<world rank>.json`` with what its main loop last reported:

* :func:`starting` ("starting the generation engine"): the rank is in its start-up (a beacon
  begins so); like busy, but bounded by the start timeout, which is larger: a start that is slow
  (an engine's, a model's build, on a loaded machine) is not a hang;
* :func:`busy` ("RL step 8 (v8 -> v9)"): the rank holds work and must make progress;
* :func:`tick`: it did (a decoding step, a scored sample, a received result);
* :func:`idle` ("waiting for work"): nothing to do; no progress is expected of it (going idle,
  or waiting for something else, counts as progress; waiting on does not).

A rank has started at its first busy or idle after its start-up. Until every rank has started, no
busy rank is judged on its progress either: it may be waiting on one still starting (a weight push
to an engine that is not up yet), and the start of the job does not count against the hang timeout.
A rank stuck in its start is named like any other, once the start timeout has passed.

The thread does not depend on the main loop, so its record tells two failures apart: a rank whose
beat is older than the timeout stopped answering (frozen, SIGSTOPped, stuck in a C call that holds
the GIL, its node gone); a rank whose beat is fresh but which has been ``busy`` without a tick for
longer than the timeout makes no progress (a deadlock in a collective, a wait that never ends). If
every rank is idle and nothing moved for the timeout, the job as a whole waits on something that
will not come (a lost message): the orchestrator, which drives everything, is named. And once the
orchestrator has finished, the job must end within :data:`EXIT_GRACE_S` (a rank hung in its
interpreter's exit, say in ``MPI_Finalize``, would otherwise hold the allocation).

The :class:`Watchdog` reads the records (it runs in the local launcher, or beside ``srun`` in the
batch script: outside the ranks it judges). On a hang it asks every rank that still answers for its
Python stacks (``RUN/hang/dump-request``; each beacon writes ``RUN/hang/stacks/<role>_<n>.txt``),
writes ``RUN/hang/report.txt`` naming the stuck ranks, their role and what they were last doing,
and its caller ends the job. The beat files are overwritten in place, one small write per rank per
beat: at 10,000 ranks and a 15 s beat that is ~670 writes/s to the shared file system.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import logging
import os
import shutil
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hetrl.control import rundir

logger = logging.getLogger(__name__)
#: Exit code of a job the watchdog ended (the requeue code is 3, see hetrl.control.rundir).
HANG_EXIT_CODE = 4
STARTING, BUSY, IDLE, EXITED = "starting", "busy", "idle", "exited"
EXIT_GRACE_S = 60.0  # how long a job may take to end once its orchestrator has finished


def beat_period_s(timeout_s: float) -> float:
    """How often ranks beat and the watchdog looks: a twentieth of the timeout, within 1-15 s
    (a hang is reported within the timeout plus about two beats and the stacks' collection)."""
    return min(15.0, max(1.0, timeout_s / 20))


@dataclass(frozen=True)
class Beat:
    """One rank's record, as its beacon last wrote it (times are wall-clock seconds)."""

    rank: int
    role: str
    role_rank: int
    host: str
    pid: int
    beat: float  # when the beacon thread last wrote
    progress: float  # the main loop's last busy/idle/tick
    state: str  # STARTING, BUSY, IDLE or EXITED
    activity: str

    @property
    def label(self) -> str:
        return f"{self.role}[{self.role_rank}] (world rank {self.rank}, pid {self.pid} on {self.host})"


class Beacon:
    """A rank's heartbeat thread; the main loop reports through :func:`busy`, :func:`idle`, :func:`tick`."""

    def __init__(self, run_dir: Path, rank: int, role: str, role_rank: int, beat_s: float) -> None:
        self.dir = rundir.hang_dir(run_dir)
        (self.dir / "beats").mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "beats" / f"rank_{rank}.json"
        self.beat_s = beat_s
        self.record = Beat(
            rank, role, role_rank, socket.gethostname(), os.getpid(), time.time(), time.time(), STARTING, "starting"
        )
        self._dumped = ""  # the id of the last dump request answered
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hetrl-beacon", daemon=True)

    def start(self) -> None:
        self._write()
        self._thread.start()

    def stop(self) -> None:
        """The rank is done: its record says so, and the watchdog stops expecting beats."""
        self._stop.set()
        self._thread.join(timeout=self.beat_s + 5)
        self.record = dataclasses.replace(self.record, state=EXITED, activity="exited")
        self._write()

    def _run(self) -> None:
        while not self._stop.wait(self.beat_s):
            try:
                self._write()
                self._answer_dump_request()
            except OSError as error:  # a shared file system's hiccup must not silence the beacon for good
                logger.warning("liveness beacon could not write its record: %s", error)

    def _write(self) -> None:
        # The main thread replaces the record whole and this thread only reads it (once): a write
        # back from here could undo a report the main thread made meanwhile.
        text = json.dumps({**asdict(self.record), "beat": time.time()})
        # Overwritten in place (no rename: one data write, no metadata traffic on a parallel FS).
        with open(self.path, "w") as f:
            f.write(text)

    def _answer_dump_request(self) -> None:
        try:
            request = (self.dir / "dump-request").read_text()
        except FileNotFoundError:
            return
        if request == self._dumped:
            return
        self._dumped = request
        stacks = self.dir / "stacks"
        stacks.mkdir(exist_ok=True)
        with open(stacks / f"{self.record.role}_{self.record.role_rank}.txt", "w") as f:
            f.write(f"{self.record.label}: {self.record.state}, {self.record.activity}\n\n")
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)


_beacon: Beacon | None = None  # this process's, like its signal handlers


def start_beacon(run_dir: Path, rank: int, role: str, role_rank: int, timeout_s: float) -> Beacon:
    """Start this process's beacon (once per process); the report functions below feed it."""
    global _beacon
    if _beacon is not None:
        raise RuntimeError("this process already has a liveness beacon")
    _beacon = Beacon(run_dir, rank, role, role_rank, beat_period_s(timeout_s))
    _beacon.start()
    return _beacon


def stop_beacon() -> None:
    global _beacon
    if _beacon is not None:
        _beacon.stop()
        _beacon = None


def starting(activity: str) -> None:
    """This rank is in a phase of its start-up (``activity`` says which); it must tick within the
    start timeout. Its first :func:`busy` or :func:`idle` after says it has started."""
    _report(STARTING, activity)


def busy(activity: str) -> None:
    """This rank holds work (``activity`` says what); it must tick within the hang timeout."""
    _report(BUSY, activity)


def idle(activity: str) -> None:
    """This rank waits for work (``activity`` says on what); no progress is expected of it.

    Going idle is progress; saying so again while the wait goes on is not (a polling loop calls
    this every round, and a job whose ranks all wait must still be seen to stand still).
    """
    if _beacon is not None and (_beacon.record.state, _beacon.record.activity) != (IDLE, activity):
        _report(IDLE, activity)


def tick() -> None:
    """This rank made progress. Cheap: call it per decoding step, per scored sample."""
    if _beacon is not None:
        _beacon.record = dataclasses.replace(_beacon.record, progress=time.time())


def _report(state: str, activity: str) -> None:
    if _beacon is not None:
        _beacon.record = dataclasses.replace(_beacon.record, state=state, activity=activity, progress=time.time())


@dataclass(frozen=True)
class Stuck:
    rank: int
    label: str
    why: str
    activity: str
    at_exit: bool = False  # the run had finished; only the processes' exit hung

    def __str__(self) -> str:
        return f"{self.label}: {self.why}; last doing: {self.activity}"


class Watchdog:
    """Judges the beats of a job's ranks against ``timeout_s``, and those of ranks still starting
    against ``start_timeout_s``; see the module docstring."""

    def __init__(
        self, run_dir: Path, ranks: dict[int, str], orchestrator_rank: int, timeout_s: float, start_timeout_s: float
    ) -> None:
        """``ranks`` maps every world rank to its label (``role[n]``), for ranks that never beat."""
        self.dir = rundir.hang_dir(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)  # no rank may have got far enough to make it
        self.ranks, self.orchestrator_rank = ranks, orchestrator_rank
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self.started = time.time()
        self.starting_until = self.started  # the last check that found a rank still starting
        self.poll_s = beat_period_s(timeout_s)
        self._last: dict[int, Beat] = {}
        (self.dir / "dump-request").unlink(missing_ok=True)

    def _beats(self) -> dict[int, Beat]:
        """This job's records (a previous job's, left in the run directory, are older than its start)."""
        for rank in self.ranks:
            try:
                beat = Beat(**json.loads((self.dir / "beats" / f"rank_{rank}.json").read_text()))
            except (FileNotFoundError, json.JSONDecodeError, TypeError):
                continue  # not started yet, or caught mid-write: the record read before stands
            if beat.beat >= self.started - 1.0:
                self._last[rank] = beat
        return dict(self._last)

    def check(self) -> list[Stuck]:
        """The stuck ranks (empty while the job is live), those that stopped answering first."""
        now = time.time()
        beats = self._beats()
        orchestrator = beats.get(self.orchestrator_rank)
        if orchestrator is not None and orchestrator.state == EXITED:
            if now - orchestrator.beat <= EXIT_GRACE_S:
                return []
            left = [b for b in beats.values() if b.state != EXITED] or list(beats.values())
            return [
                Stuck(
                    b.rank,
                    b.label,
                    f"the job has not ended {now - orchestrator.beat:.0f} s after the orchestrator finished",
                    f"{b.state}: {b.activity}",
                    at_exit=True,
                )
                for b in left
            ]
        if len(beats) < len(self.ranks) or any(b.state == STARTING for b in beats.values()):
            self.starting_until = now
        silent, stalled = [], []
        for rank, label in self.ranks.items():
            beat = beats.get(rank)
            if beat is None:
                if now - self.started > self.start_timeout_s:
                    silent.append(
                        Stuck(
                            rank,
                            f"{label} (world rank {rank})",
                            f"never started within monitor.start_timeout_s={self.start_timeout_s:g} s",
                            "starting",
                        )
                    )
                continue
            if beat.state == EXITED:
                continue
            if beat.state == STARTING:
                bound, since = self.start_timeout_s, beat.progress
            else:  # a busy rank's wait on one still starting is no hang of its own
                bound, since = self.timeout_s, max(beat.progress, self.starting_until)
            stalled_too = beat.state in (STARTING, BUSY) and now - since > bound
            # A record is a snapshot: a rank frozen a beat after its last tick shows a progress older than
            # its beat, so it looks stalled before it looks silent. Once the job is stuck, a beacon that
            # missed two beats is the better explanation: it stopped answering.
            # Silence is judged against the hang timeout whatever the state: the beacon thread beats through
            # a slow start too, so a rank that stopped beating is frozen or gone (a rank frozen a beat after
            # its start would otherwise be given the whole start timeout).
            if now - beat.beat > self.timeout_s or (stalled_too and now - beat.beat > 2 * self.poll_s):
                silent.append(
                    Stuck(
                        rank,
                        beat.label,
                        f"stopped answering {now - beat.beat:.0f} s ago (frozen, stopped or gone)",
                        f"{beat.state}: {beat.activity}",
                    )
                )
            elif stalled_too:
                why = f"no progress for {now - beat.progress:.0f} s"
                if beat.state == STARTING:
                    why += f" of its start (monitor.start_timeout_s={self.start_timeout_s:g} s)"
                stalled.append(Stuck(rank, beat.label, why, beat.activity))
        if silent or stalled:
            return silent + sorted(stalled, key=lambda s: beats[s.rank].progress)
        live = [b for b in beats.values() if b.state != EXITED]
        if len(beats) == len(self.ranks) and live and all(b.state == IDLE for b in live):
            last = max(b.progress for b in live)
            orchestrator = beats[self.orchestrator_rank]
            if now - last > self.timeout_s and orchestrator.state != EXITED:
                return [
                    Stuck(
                        self.orchestrator_rank,
                        orchestrator.label,
                        f"every rank has been idle for {now - last:.0f} s: the job waits on something that will not "
                        f"come",
                        orchestrator.activity,
                    )
                ]
        return []

    def collect_stacks(self) -> list[Path]:
        """Ask every answering rank for its stacks and wait (bounded) for them; the files written."""
        stacks = self.dir / "stacks"
        previous = [path for path in (stacks, self.dir / "report.txt", self.dir / "report.json") if path.exists()]
        if previous:  # a previous hang of this run: keep its evidence beside
            earlier = self.dir / f"earlier-{int(self.started)}"
            earlier.mkdir(exist_ok=True)
            for path in previous:
                shutil.move(str(path), earlier / path.name)
        (self.dir / "dump-request").write_text(f"{time.time():.3f}")
        answering = [b for b in self._beats().values() if b.state != EXITED and time.time() - b.beat <= self.timeout_s]
        deadline = time.monotonic() + self.poll_s + 5  # every beacon looks for the request once per beat
        expected = {stacks / f"{b.role}_{b.role_rank}.txt" for b in answering}
        while time.monotonic() < deadline and not all(p.exists() for p in expected):
            time.sleep(0.2)
        time.sleep(0.5)  # let the last writers finish their files
        return sorted(p for p in expected if p.exists())

    def report(self, stuck: list[Stuck], stacks: list[Path]) -> str:
        """Write ``RUN/hang/report.txt`` (and ``report.json``); the message to print."""
        lines = [
            f"[hetrl] HANG: no progress within monitor.hang_timeout_s={self.timeout_s:g} s "
            f"(monitor.start_timeout_s={self.start_timeout_s:g} s for a rank's start); stuck:"
        ]
        lines += [f"  - {s}" for s in stuck]
        lines.append(f"  Python stacks of the {len(stacks)} rank(s) still answering: {self.dir / 'stacks'}/")
        text = "\n".join(lines)
        (self.dir / "report.txt").write_text(text + "\n")
        (self.dir / "report.json").write_text(
            json.dumps(
                {
                    "timeout_s": self.timeout_s,
                    "start_timeout_s": self.start_timeout_s,
                    "time": time.time(),
                    "stuck": [asdict(s) for s in stuck],
                    "stacks": [str(p) for p in stacks],
                },
                indent=1,
            )
        )
        return text


def watchdog_for(run_dir: Path, plan: Any, timeout_s: float, start_timeout_s: float) -> Watchdog:
    """The watchdog of the job ``plan`` (a hetrl.control.plan.Plan) running in ``run_dir``."""
    ranks = {a.world_rank: f"{a.role}[{a.role_rank}]" for a in plan.assignments}
    return Watchdog(run_dir, ranks, plan.ranks_of("orchestrator")[0], timeout_s, start_timeout_s)


def run_had_finished(run_dir: Path, stuck: list[Stuck]) -> bool:
    """Whether only the exit of a finished run hung (its summary is written): done, not to rerun."""
    return all(s.at_exit for s in stuck) and (Path(run_dir) / rundir.SUMMARY).exists()


def handle_hang(watchdog: Watchdog, stuck: list[Stuck]) -> str:
    """Stacks, report, message: everything but ending the job, which is the caller's (and must
    happen even if this raises)."""
    try:
        stacks = watchdog.collect_stacks()
    except OSError as error:
        print(f"[hetrl] could not collect the ranks' stacks: {error}", flush=True)
        stacks = []
    message = watchdog.report(stuck, stacks)
    print(message, flush=True)
    return message
