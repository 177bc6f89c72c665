"""The liveness watchdog beside ``srun`` in the batch script: ``python -m hetrl.launch.watchdog``.

It watches the job step's ranks (see :mod:`hetrl.control.liveness`) while the step runs. On a
hang it collects the stacks, writes ``RUN/hang/report.txt``, decides whether the run may be
restarted (at most ``monitor.hang_restarts`` times in a row without a newer checkpoint: a
deterministic hang must not loop until the allocation's walltime), writes
:data:`hetrl.control.rundir.REQUEUE_AFTER_HANG` if so, and kills the step's tasks. The
batch script then requeues the job, which resumes from its last checkpoint, as after a pre-emption.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import yaml

from hetrl.config.loader import validate_tree
from hetrl.control import liveness, rundir
from hetrl.control.plan import Plan

RESTARTS_FILE = "restarts"  # in RUN/hang/: hangs in a row, and the latest checkpoint when the last one came


def record_restart(run_dir: Path, max_restarts: int) -> bool:
    """Count one more hang of this run; whether it may still be requeued.

    Hangs count in a row: one after a newer checkpoint than the previous hang's starts the count
    again, so a long run survives many unrelated hangs, and a deterministic one (it recurs before
    the run gets any further) is requeued at most ``max_restarts`` times.
    """
    counter = rundir.hang_dir(run_dir) / RESTARTS_FILE
    # A step_N.tmp is a save in progress (or one that crashed): a hang during a save got no further.
    checkpoints = sorted(p.name for p in rundir.checkpoint_root(run_dir).glob("step_*") if not p.name.endswith(".tmp"))
    latest = checkpoints[-1] if checkpoints else "none"
    count, since = counter.read_text().split() if counter.exists() else ("0", latest)
    hangs = int(count) + 1 if since == latest else 1
    counter.write_text(f"{hangs} {latest}\n")
    return hangs <= max_restarts


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill_step(step_pid: int) -> None:
    """End the job step's tasks on every node, not the batch shell: two SIGINTs within a second make
    srun terminate the step (``scancel --signal=KILL`` would cancel the whole job, batch shell too)."""
    for _ in range(2):
        if _alive(step_pid):
            os.kill(step_pid, signal.SIGINT)
            time.sleep(0.2)
    deadline = time.monotonic() + 60
    while _alive(step_pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    if _alive(step_pid):  # srun itself is stuck: take it down, slurmstepd then reaps the tasks
        os.kill(step_pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--step-pid", required=True, type=int, help="the srun running the job step")
    args = parser.parse_args(argv)

    cfg = validate_tree(yaml.safe_load((args.run_dir / rundir.CONFIG).read_text()))
    plan = Plan.from_json((args.run_dir / rundir.PLAN).read_text())
    watchdog = liveness.watchdog_for(args.run_dir, plan, cfg.monitor.hang_timeout_s, cfg.monitor.start_timeout_s)
    (rundir.hang_dir(args.run_dir) / rundir.REQUEUE_AFTER_HANG).unlink(missing_ok=True)
    while _alive(args.step_pid):
        time.sleep(watchdog.poll_s)
        stuck = watchdog.check()
        if not stuck:
            continue
        try:
            liveness.handle_hang(watchdog, stuck)
            if liveness.run_had_finished(args.run_dir, stuck):
                print("[hetrl] the run had finished; only its exit hung: not requeued", flush=True)
            elif record_restart(args.run_dir, cfg.monitor.hang_restarts):
                (rundir.hang_dir(args.run_dir) / rundir.REQUEUE_AFTER_HANG).write_text("\n")
            else:
                print(
                    f"[hetrl] the run hung {cfg.monitor.hang_restarts + 1} times in a row without a new checkpoint: "
                    f"not requeued",
                    flush=True,
                )
        finally:
            _kill_step(args.step_pid)
        return liveness.HANG_EXIT_CODE
    return 0


if __name__ == "__main__":
    sys.exit(main())
