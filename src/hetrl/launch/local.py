"""Local launch: every role as its own process(es) under one MPMD ``mpiexec`` (MPICH, pip wheel).

The launcher owns the job's lifetime: mpiexec runs in a session of its own, SIGINT/SIGTERM to the
launcher are forwarded to that whole process group as SIGTERM (the loop's pre-emption signal:
checkpoint, then exit with the requeue code), SIGKILL after a grace period, and
every rank also dies with its MPI proxy (PR_SET_PDEATHSIG), so nothing outlives the launcher.
While it waits, the launcher runs the liveness watchdog (:mod:`hetrl.control.liveness`): a hung
job has its stacks collected, its stuck ranks named, and its whole session killed.

When the launcher's stdout is a terminal, the orchestrator is told so (and the terminal's size), and
draws the monitor's live view through mpiexec's pipe; otherwise it prints one line per step.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from hetrl.config.schema import HetrlConfig
from hetrl.control import liveness, rundir
from hetrl.control.plan import CPU_ROLES, Plan
from hetrl.launch.worker import TERMINAL_ENV


def find_mpiexec() -> str:
    """The mpiexec next to this Python (the pip ``mpich`` wheel), else one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if not found:
        raise RuntimeError("mpiexec not found: install the MPICH wheel (pip install mpich) or a system MPI")
    return found


def threads_per_role(cfg: HetrlConfig, plan: Plan) -> dict[str, int]:
    """torch/OMP threads per process: heavy roles share the cores, light ones take one each.

    Oversubscription costs 20-40x on a 2-core machine, so this is never left to the defaults.
    Reward servers take one thread each: they serve small frozen models between the steps' heavy phases.
    """
    cores = os.cpu_count() or 1
    light = (*CPU_ROLES, "reward_server")
    heavy = sum(n for role, n in plan.role_sizes().items() if role not in light)
    if plan.rollout.placement == "colocated":
        heavy = max(plan.role_sizes()["trainer"], plan.role_sizes()["rollout"])  # time-shared, not concurrent
    heavy_threads = cfg.run.threads_per_process or max(1, cores // max(heavy, 1))
    return {role: (1 if role in light else heavy_threads) for role in plan.role_sizes()}


def mpiexec_command(
    cfg: HetrlConfig,
    plan: Plan,
    run_dir: Path,
    python: str = sys.executable,
    check: bool = False,
    terminal: os.terminal_size | None = None,
) -> list[str]:
    """MPMD command: one ``-n K ... worker`` segment per run of consecutive ranks of a role.

    ``terminal``: the size of the terminal the job's output goes to, if it goes to one. The
    orchestrator gets it as ``COLUMNS``/``LINES`` (which rich reads), with :data:`TERMINAL_ENV`.
    """
    threads = threads_per_role(cfg, plan)
    command = [find_mpiexec(), "-launcher", "fork"]
    segments = itertools.groupby(plan.assignments, key=lambda a: a.role)
    for index, (role, ranks) in enumerate(segments):
        t = str(threads[role])
        command += [] if index == 0 else [":"]
        command += [
            "-n",
            str(len(list(ranks))),
            "-env",
            "OMP_NUM_THREADS",
            t,
            "-env",
            "HETRL_THREADS",
            t,
            "-env",
            "HETRL_ROLE",
            role,
        ]
        if role == "orchestrator" and terminal is not None:
            command += [
                "-env",
                TERMINAL_ENV,
                "1",
                "-env",
                "COLUMNS",
                str(terminal.columns),
                "-env",
                "LINES",
                str(terminal.lines),
            ]
        command += [python, "-m", "hetrl.launch.worker", "--run-dir", str(run_dir)]
        command += ["--check"] if check else []
    return command


def run_local(cfg: HetrlConfig, plan: Plan, run_dir: Path, grace_s: float | None = None, check: bool = False) -> int:
    """Run the job in the foreground; return its exit code.

    A SIGINT/SIGTERM to the launcher is forwarded to the job as SIGTERM, which the ranks treat as a
    pre-emption: checkpoint at the next step boundary, exit with the requeue code. The job gets
    ``grace_s`` (default ``cluster.signal_grace_s``, the time Slurm would give it) before it is
    killed; a second signal kills it at once. A job that had to be killed returns 128 + the signal.
    One that ended by itself returns the requeue code if the orchestrator stopped at a checkpoint for
    a requeue (its marker in the run directory decides, not mpiexec's code: mpiexec kills a rank
    still in its interpreter's exit once the orchestrator has exited non-zero, and reports that),
    else its own code (128 + the signal for a non-zero one after a signal). A job the liveness
    watchdog found hung returns :data:`hetrl.control.liveness.HANG_EXIT_CODE` (no requeue locally),
    or 0 if the run had finished and only the processes' exit hung.
    """
    marker = Path(run_dir) / rundir.REQUEUE_MARKER
    marker.unlink(missing_ok=True)  # a previous process's; this one writes its own
    grace = float(cfg.cluster.signal_grace_s if grace_s is None else grace_s)
    watchdog = liveness.watchdog_for(run_dir, plan, cfg.monitor.hang_timeout_s, cfg.monitor.start_timeout_s)
    terminal = shutil.get_terminal_size() if sys.stdout.isatty() else None
    proc = subprocess.Popen(mpiexec_command(cfg, plan, run_dir, check=check, terminal=terminal), start_new_session=True)
    received: list[int] = []
    kill_at: list[float] = []  # when the grace after the first signal runs out
    killed = False

    def forward(signum, _frame):
        nonlocal killed
        killed = bool(received)
        _signal_group(proc, signal.SIGKILL if killed else signal.SIGTERM)
        received.append(signum)
        kill_at.append(time.monotonic() + grace)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                code = proc.wait(
                    timeout=min(watchdog.poll_s, max(0.0, kill_at[0] - time.monotonic()))
                    if received
                    else watchdog.poll_s
                )
                break
            except subprocess.TimeoutExpired:
                pass
            if received:
                if time.monotonic() > kill_at[0]:
                    _kill_job(proc)
                    killed = True
            elif stuck := watchdog.check():
                try:
                    liveness.handle_hang(watchdog, stuck)
                finally:
                    _kill_job(proc)
                proc.wait()
                return 0 if liveness.run_had_finished(run_dir, stuck) else liveness.HANG_EXIT_CODE
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _kill_job(proc)  # stragglers of a job that ended by itself
    if killed:
        return 128 + received[0]
    if code != 0 and marker.exists():
        return rundir.REQUEUE_EXIT_CODE
    return 128 + received[0] if received and code != 0 else code


def _kill_job(proc: subprocess.Popen) -> None:
    """SIGKILL the job's whole session: its process group, and any process that left the group."""
    _signal_group(proc, signal.SIGKILL)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # Fields after the command name (which may hold spaces): state, ppid, pgrp, session, ...
            session = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[3])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
        if session == proc.pid:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
