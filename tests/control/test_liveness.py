"""The liveness watchdog's judgement, on beat records written by real beacons (no MPI job)."""

import dataclasses
import json
import time
from pathlib import Path

import pytest

from hetrl.control import liveness
from hetrl.control.liveness import Beacon, Watchdog
from hetrl.launch.watchdog import record_restart

RANKS = {0: "trainer[0]", 1: "rollout[0]", 2: "orchestrator[0]"}
TIMEOUT_S = 60.0
START_TIMEOUT_S = 300.0


def _write(
    run_dir: Path, rank: int, role: str, *, beat_age: float, progress_age: float, state: str, activity: str = "x"
) -> None:
    """A record as a beacon of ``rank`` would have left it."""
    beacon = Beacon(run_dir, rank, role, 0, beat_s=1.0)
    now = time.time()
    record = {
        **json.loads(json.dumps(beacon.record.__dict__)),
        "beat": now - beat_age,
        "progress": now - progress_age,
        "state": state,
        "activity": activity,
    }
    beacon.path.write_text(json.dumps(record))


@pytest.fixture
def watchdog(tmp_path) -> Watchdog:
    dog = Watchdog(tmp_path, RANKS, orchestrator_rank=2, timeout_s=TIMEOUT_S, start_timeout_s=START_TIMEOUT_S)
    dog.started = dog.starting_until = dog.started - 1000  # the job started long ago: records of any age are this job's
    return dog


def test_a_live_job_is_not_stuck(tmp_path, watchdog):
    _write(tmp_path, 0, "trainer", beat_age=1, progress_age=5, state="busy", activity="training step 3")
    _write(tmp_path, 1, "rollout", beat_age=1, progress_age=500, state="idle")  # idle however long: not stuck
    _write(tmp_path, 2, "orchestrator", beat_age=1, progress_age=5, state="idle")
    assert watchdog.check() == []


def test_a_rank_that_stopped_answering_is_named_first(tmp_path, watchdog):
    _write(
        tmp_path, 0, "trainer", beat_age=1, progress_age=100, state="busy", activity="pushing weights v8 to the engines"
    )
    _write(tmp_path, 1, "rollout", beat_age=90, progress_age=95, state="idle", activity="waiting for episodes")
    _write(tmp_path, 2, "orchestrator", beat_age=1, progress_age=2, state="idle")
    stuck = watchdog.check()
    assert [s.rank for s in stuck] == [1, 0]
    assert "stopped answering" in stuck[0].why and "rollout[0]" in stuck[0].label
    assert "no progress for 100 s" in stuck[1].why and stuck[1].activity == "pushing weights v8 to the engines"


def test_a_rank_frozen_a_beat_after_its_last_tick_is_named_as_stopped_answering(tmp_path, watchdog):
    """Its record shows a progress older than its beat: stalled by the clock, but its beacon went quiet."""
    _write(tmp_path, 0, "trainer", beat_age=1, progress_age=5, state="idle")
    _write(
        tmp_path, 1, "rollout", beat_age=TIMEOUT_S - 2, progress_age=TIMEOUT_S + 1, state="busy", activity="generating"
    )
    _write(tmp_path, 2, "orchestrator", beat_age=1, progress_age=2, state="idle")
    (stuck,) = watchdog.check()
    assert stuck.rank == 1 and "stopped answering 58 s ago" in stuck.why and stuck.activity == "busy: generating"


def test_a_busy_rank_without_progress_is_stuck_and_an_exited_one_is_not(tmp_path, watchdog):
    _write(tmp_path, 0, "trainer", beat_age=1, progress_age=61, state="busy", activity="TrainWork (holding v3)")
    _write(tmp_path, 1, "rollout", beat_age=500, progress_age=500, state="exited")
    _write(tmp_path, 2, "orchestrator", beat_age=1, progress_age=1, state="idle")
    assert [(s.rank, s.activity) for s in watchdog.check()] == [(0, "TrainWork (holding v3)")]


def test_a_job_where_every_rank_idles_names_the_orchestrator(tmp_path, watchdog):
    for rank, role in ((0, "trainer"), (1, "rollout")):
        _write(tmp_path, rank, role, beat_age=1, progress_age=70, state="idle")
    _write(
        tmp_path,
        2,
        "orchestrator",
        beat_age=1,
        progress_age=65,
        state="idle",
        activity="waiting for the trainer's step 4",
    )
    stuck = watchdog.check()
    assert [s.rank for s in stuck] == [2] and "every rank has been idle" in stuck[0].why
    assert stuck[0].activity == "waiting for the trainer's step 4"


def test_a_rank_that_never_started_is_named_after_the_start_timeout(tmp_path):
    # no rank made RUN/hang/
    dog = Watchdog(
        tmp_path / "fresh_run", RANKS, orchestrator_rank=2, timeout_s=TIMEOUT_S, start_timeout_s=START_TIMEOUT_S
    )
    assert dog.check() == []  # just launched
    dog.started -= TIMEOUT_S + 1
    assert dog.check() == []  # a slow start is no hang
    dog.started -= START_TIMEOUT_S - TIMEOUT_S
    stuck = dog.check()
    assert [s.rank for s in stuck] == [0, 1, 2] and "never started within monitor.start_timeout_s=300 s" in stuck[0].why
    liveness.handle_hang(dog, stuck)  # nobody to ask for stacks: still a report
    assert (tmp_path / "fresh_run" / "hang" / "report.txt").exists()


def test_a_job_that_does_not_end_after_its_orchestrator_finished_is_stuck_at_exit(tmp_path, watchdog):
    _write(tmp_path, 0, "trainer", beat_age=1, progress_age=1, state="busy", activity="in MPI_Finalize")
    _write(tmp_path, 1, "rollout", beat_age=70, progress_age=70, state="exited")
    _write(tmp_path, 2, "orchestrator", beat_age=30, progress_age=30, state="exited")
    assert watchdog.check() == []  # within the exit grace
    _write(tmp_path, 2, "orchestrator", beat_age=61, progress_age=61, state="exited")
    assert [(s.rank, s.at_exit) for s in watchdog.check()] == [(0, True)]


def _push_to_a_starting_engine(run_dir: Path, *, starting_for: float, pushing_for: float) -> None:
    """The trainer pushes weights to an engine still starting (as after a resume); the orchestrator waits."""
    _write(run_dir, 0, "trainer", beat_age=1, progress_age=pushing_for, state="busy", activity="pushing weights v4")
    _write(
        run_dir, 1, "rollout", beat_age=1, progress_age=starting_for, state="starting", activity="starting the engine"
    )
    _write(run_dir, 2, "orchestrator", beat_age=1, progress_age=pushing_for, state="idle", activity="waiting")


def test_a_slow_start_is_no_hang_and_a_wait_on_it_none_either(tmp_path, watchdog):
    """An engine starting for longer than the hang timeout, and the trainer's push waiting on it."""
    _push_to_a_starting_engine(tmp_path, starting_for=200, pushing_for=200)
    assert watchdog.check() == []
    # The engine has started: the push's wait counts from there, not from its own start.
    _write(tmp_path, 1, "rollout", beat_age=1, progress_age=2, state="busy", activity="receiving weights v4")
    assert watchdog.check() == []
    watchdog.starting_until -= TIMEOUT_S + 1  # a hang timeout later, the push is still stuck
    assert [(s.rank, s.why) for s in watchdog.check()] == [(0, "no progress for 200 s")]


def test_a_start_beyond_the_start_timeout_is_named_alone(tmp_path, watchdog):
    """The engine stuck in its start is the cause; the trainer waiting on it is not named."""
    _push_to_a_starting_engine(tmp_path, starting_for=301, pushing_for=400)
    (stuck,) = watchdog.check()
    assert stuck.rank == 1 and stuck.activity == "starting the engine"
    assert stuck.why == "no progress for 301 s of its start (monitor.start_timeout_s=300 s)"
    assert "monitor.start_timeout_s=300 s" in liveness.handle_hang(watchdog, [stuck])


def test_a_starting_rank_that_stopped_answering_is_named_after_the_hang_timeout(tmp_path, watchdog):
    """Its beacon thread beats through a slow start, so silence means frozen or gone: a rank frozen a beat
    after its start (its record still says starting) is named at the hang timeout, not the start timeout."""
    _write(tmp_path, 0, "trainer", beat_age=1, progress_age=1, state="idle")
    starting = dict(state="starting", activity="starting the generation engine")
    _write(tmp_path, 1, "rollout", beat_age=TIMEOUT_S - 10, progress_age=TIMEOUT_S - 10, **starting)
    _write(tmp_path, 2, "orchestrator", beat_age=1, progress_age=1, state="idle")
    assert watchdog.check() == []
    _write(tmp_path, 1, "rollout", beat_age=TIMEOUT_S + 10, progress_age=TIMEOUT_S + 10, **starting)
    (stuck,) = watchdog.check()
    assert stuck.rank == 1 and f"stopped answering {TIMEOUT_S + 10:.0f} s ago" in stuck.why


def test_a_rank_is_starting_until_its_first_busy_or_idle(tmp_path):
    beacon = liveness.start_beacon(tmp_path, 0, "rollout", 0, timeout_s=10)
    try:
        assert json.loads(beacon.path.read_text())["state"] == "starting"
        liveness.starting("starting the generation engine")
        assert beacon.record.state == "starting"
        liveness.idle("waiting for episodes")
        assert beacon.record.state == "idle"
    finally:
        liveness.stop_beacon()


def test_waiting_on_is_not_progress(tmp_path):
    """A polling loop says idle every round; only going idle (or a new wait) counts as progress."""
    liveness.start_beacon(tmp_path, 0, "rollout", 0, timeout_s=10)
    try:
        liveness.idle("waiting for episodes")
        went_idle = liveness._beacon.record.progress
        time.sleep(0.01)
        liveness.idle("waiting for episodes")
        assert liveness._beacon.record.progress == went_idle
        liveness.idle("waiting for weights")
        assert liveness._beacon.record.progress > went_idle
    finally:
        liveness.stop_beacon()


def test_records_of_a_previous_job_in_the_run_dir_are_ignored(tmp_path):
    _write(tmp_path, 0, "trainer", beat_age=5, progress_age=5, state="busy")  # written before this job started
    dog = Watchdog(
        tmp_path, {0: "trainer[0]"}, orchestrator_rank=0, timeout_s=TIMEOUT_S, start_timeout_s=START_TIMEOUT_S
    )
    assert dog._beats() == {}


@pytest.mark.parametrize(
    "report, activity",
    [(liveness.busy, "pushing weights v8 to the engines"), (liveness.starting, "starting the generation engine")],
)
def test_stacks_and_report_of_a_hang(tmp_path, report, activity):
    """A live beacon answers the dump request with this process's stacks; the report names the rank,
    whether it hung at work (10 s bound) or in its start (20 s bound)."""
    beacon = liveness.start_beacon(tmp_path, 0, "trainer", 0, timeout_s=10)  # beats every second
    try:
        report(activity)
        record = liveness._beacon.record
        liveness._beacon.record = dataclasses.replace(record, progress=record.progress - 21)  # no progress for 21 s
        beacon._write()  # as its next beat does
        dog = Watchdog(tmp_path, {0: "trainer[0]"}, orchestrator_rank=0, timeout_s=10, start_timeout_s=20)
        dog.started = dog.starting_until = dog.started - 100
        stuck = dog.check()
        assert [s.rank for s in stuck] == [0]
        message = liveness.handle_hang(dog, stuck)
    finally:
        liveness.stop_beacon()
    stacks = (tmp_path / "hang" / "stacks" / "trainer_0.txt").read_text()
    assert activity in stacks and "test_stacks_and_report_of_a_hang" in stacks
    assert "trainer[0]" in message and (tmp_path / "hang" / "report.txt").read_text().strip() == message
    assert json.loads(beacon.path.read_text())["state"] == "exited"


def test_hang_restarts_are_capped_unless_the_run_got_further(tmp_path):
    (tmp_path / "hang").mkdir()
    assert [record_restart(tmp_path, 2) for _ in range(3)] == [True, True, False]  # a deterministic hang
    (tmp_path / "checkpoints" / "step_00000004").mkdir(parents=True)  # progress since: the count starts again
    assert [record_restart(tmp_path, 2) for _ in range(3)] == [True, True, False]
    (tmp_path / "checkpoints" / "step_00000008.tmp").mkdir()  # a hang during a save: no further
    assert record_restart(tmp_path, 2) is False
