"""Entry point of every rank: ``python -m hetrl.launch.worker --run-dir RUN``.

The same command runs under ``mpiexec`` (local) and ``srun --het-group`` (Slurm). Each rank reads
the resolved config and plan from the run directory, finds its role from its MPI world rank, joins
the control plane and runs its role. An uncaught exception prints the traceback with the rank's
role and aborts the whole MPI job, so a crashed role brings the job down instead of hanging it.

The console is hetrl's: a rank's file descriptors 1 and 2 go to its log (``RUN/logs/<role>_<rank>.log``),
so what its libraries print (vLLM's logger, Python warnings, tqdm bars, C++ warnings written straight
to the descriptors) lands there. Crash reports go to a copy of the original stderr, and the
orchestrator keeps the original stdout as ``sys.stdout`` for its progress lines and summary.
``monitor.verbose`` leaves the descriptors on the console.

Faults for tests are injected with ``HETRL_INJECT_FAULT`` (see ``hetrl.loop.faults``).
"""

from __future__ import annotations

import argparse
import ctypes
import io
import logging
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import IO

import yaml

_PR_SET_PDEATHSIG = 1
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)
# Set (to "1") by the local launcher on the orchestrator when the launcher's own stdout is a
# terminal: mpiexec's pipe sits between them, so the orchestrator cannot see it for itself.
TERMINAL_ENV = "HETRL_TERMINAL"


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL us if our parent (the MPI proxy) dies: no orphans on hard kills."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the launcher's process-group kill still applies


def _keeps_freed_memory(assignment) -> bool:  # noqa: ANN001 - hetrl.control.plan.RankAssignment
    """Whether this rank should keep the memory it frees (:func:`_keep_freed_memory`): a trainer or
    engine rank without GPUs, whose steps allocate and free large tensors on CPU. The orchestrator,
    reward, env and reward-server ranks gain nothing from it and would stay at their peak size (on a
    cluster's CPU partition, for the whole run)."""
    return assignment.role in ("trainer", "rollout") and not assignment.gpus


def _keep_freed_memory() -> None:
    """A trainer or engine rank on CPU keeps the memory it frees for its next allocations (glibc's malloc).

    glibc serves blocks over its mmap threshold (32 MB at most) with fresh pages and gives them back
    on free, so every CPU training step faults its activations in again: ~800,000 page faults and
    ~1.3 s of kernel time a step for the ~44M model of bench/vs_trl.py, whose forward-backward took
    9.9 s in a run and 7.4 s with this. The price: the process stays at its peak size, and the heap
    can hold up to about twice a step's peak while it settles (tests/launch/test_worker_memory.py).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_MAX, 0)
        libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)
    except (OSError, AttributeError):
        pass  # not glibc: its own allocator's behaviour applies


def _abort_on_exception(world, label: str, console: IO[str]) -> None:
    def hook(exc_type, exc, tb):
        console.write(f"\n[hetrl] {label} crashed:\n{''.join(traceback.format_exception(exc_type, exc, tb))}")
        console.flush()
        logging.critical("crashed", exc_info=(exc_type, exc, tb))  # also in the role's own log
        world.Abort(1)

    sys.excepthook = hook


class _Terminal(io.TextIOWrapper):
    """The launcher's terminal, reached through mpiexec's pipe: a TTY to whoever asks (the monitor's live view)."""

    def isatty(self) -> bool:
        return True


def keep_stdout(terminal: bool) -> None:
    """Point ``sys.stdout`` at a copy of descriptor 1, so it stays on the console when :func:`send_output_to` moves 1.

    ``terminal``: the launcher's stdout is a terminal, so the stream says it is one.
    """
    sys.stdout.flush()
    binary = os.fdopen(os.dup(1), "wb")
    sys.stdout = (_Terminal if terminal else io.TextIOWrapper)(
        binary, encoding=sys.stdout.encoding, errors=sys.stdout.errors, line_buffering=True
    )


def send_output_to(log_path: Path) -> IO[str]:
    """Redirect descriptors 1 and 2 of this process (and of the children it starts) to ``log_path``, appending.

    Returns a stream on a copy of the original descriptor 2, for hetrl's own messages to the console.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    console = os.fdopen(os.dup(2), "w", encoding=sys.stderr.encoding, errors="backslashreplace", buffering=1)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    return console


def _pin_threads() -> None:
    """torch's intra-op threads as the launcher sized them (oversubscription costs 20-40x here)."""
    threads = os.environ.get("HETRL_THREADS")
    if threads:
        import torch

        torch.set_num_threads(int(threads))


def visible_devices(assigned: tuple[int, ...], inherited: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a rank that drives the plan's local GPUs ``assigned``.

    The plan numbers a node's GPUs 0..N-1; where Slurm (or a site) already narrowed the view, those
    are positions in the inherited list, so they are mapped through it.
    """
    if not inherited:
        return ",".join(str(gpu) for gpu in assigned)
    visible = [d.strip() for d in inherited.split(",") if d.strip()]
    missing = [gpu for gpu in assigned if gpu >= len(visible)]
    if missing:
        raise RuntimeError(
            f"the plan gives this rank GPUs {list(assigned)}, but CUDA_VISIBLE_DEVICES={inherited!r} shows "
            f"{len(visible)}"
        )
    return ",".join(visible[gpu] for gpu in assigned)


def _bind_engine_gpus(assignment) -> None:  # noqa: ANN001 - hetrl.control.plan.RankAssignment
    """A rollout or reward-server rank sees only its engine's GPUs, before anything initialises CUDA.

    vLLM places an engine's TP workers on the first visible devices: without this, every engine of
    a node would share GPU 0. Trainer ranks keep the node's view (they pick their device by rank).
    """
    if assignment.role in ("rollout", "reward_server") and assignment.gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible_devices(assignment.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--check", action="store_true", help="handshake only: check the job's wiring, then exit")
    args = parser.parse_args(argv)
    _die_with_parent()

    # here, not at the top: the local launcher imports this module (TERMINAL_ENV) and must not load
    # the control plane; a rank loads it once the death signal is armed
    from hetrl.config.loader import validate_tree
    from hetrl.control import liveness, rundir, timeline
    from hetrl.control.comm import flush_sends, init_control_plane
    from hetrl.control.handshake import run_handshake
    from hetrl.control.plan import Plan
    from hetrl.loop.faults import RankFaults

    run_dir = args.run_dir
    cfg = validate_tree(yaml.safe_load((run_dir / rundir.CONFIG).read_text()))
    plan = Plan.from_json((run_dir / rundir.PLAN).read_text())
    ctx = init_control_plane(plan)
    label = f"{ctx.role}[{ctx.assignment.role_rank}] (world rank {ctx.rank})"
    (run_dir / rundir.LOGS).mkdir(exist_ok=True)
    log_path = run_dir / rundir.LOGS / f"{ctx.role}_{ctx.assignment.role_rank}.log"
    if ctx.role == "orchestrator":
        keep_stdout(terminal=os.environ.get(TERMINAL_ENV) == "1")
    _abort_on_exception(ctx.world, label, sys.stderr if cfg.monitor.verbose else send_output_to(log_path))
    logging.basicConfig(
        filename=log_path,
        level=logging.INFO,
        format=f"%(asctime)s {ctx.role}[{ctx.assignment.role_rank}] %(levelname)s %(message)s",
    )
    logging.info("recipe %s: joined the control plane as %s", cfg.recipe, ctx.assignment)
    faults = RankFaults.from_env(ctx.role, ctx.assignment.role_rank)
    faults.at_start()
    liveness.start_beacon(run_dir, ctx.rank, ctx.role, ctx.assignment.role_rank, cfg.monitor.hang_timeout_s)
    if cfg.monitor.timeline:
        timeline.start(run_dir, ctx.role, ctx.assignment.role_rank)
    run_handshake(ctx, run_dir)
    logging.info("handshake done")
    if args.check:
        flush_sends()
        liveness.stop_beacon()
        return 0
    _bind_engine_gpus(ctx.assignment)
    _pin_threads()
    if _keeps_freed_memory(ctx.assignment):
        _keep_freed_memory()
    return _run(ctx, cfg, run_dir, faults)


def _run(ctx, cfg, run_dir: Path, faults) -> int:
    """The role under pre-emption handling; the rank's exit code (the requeue code after a pre-emption).

    The orchestrator exits last (it waits for every rank's bye), so a launcher that kills the job
    on the first non-zero exit (``srun --kill-on-bad-exit``) cannot cut another rank's shutdown short.
    """
    # at call time, as in main(); the roles (and through them torch) load only in a rank
    from hetrl.control import liveness, rundir, timeline
    from hetrl.control.comm import flush_sends
    from hetrl.loop import preempt
    from hetrl.loop.roles import run_role

    preempt.install_handlers(ctx)
    code = 0
    try:
        run_role(ctx, cfg, run_dir, faults)
    except preempt.Preempted as stop:
        logging.warning("%s; exiting with %d for a requeue", stop, rundir.REQUEUE_EXIT_CODE)
        code = rundir.REQUEUE_EXIT_CODE
        if ctx.role == "orchestrator":
            preempt.mark_requeue(run_dir, stop.checkpoint)
    if ctx.role == "orchestrator":
        preempt.wait_for_byes(ctx)
    else:
        preempt.say_bye(ctx)
    flush_sends()
    liveness.stop_beacon()
    timeline.stop()
    logging.info("role finished; exiting with %d", code)
    return code


if __name__ == "__main__":
    sys.exit(main())
