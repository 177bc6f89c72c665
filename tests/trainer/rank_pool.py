"""A pool of spawned gloo ranks that runs test jobs, so megatron is imported once per session.

Importing torch + megatron takes 5-20 s per process on the CI box; spawning fresh ranks for every
multi-rank test would blow the suite's time budget. The pool starts ``world_size`` processes once
(one CPU thread each), builds one gloo world, and then runs ``job(rank, world_size, *args)`` on
every rank for each :meth:`RankPool.run`, returning the per-rank results. A job owns the megatron
parallel state it creates and must tear it down (``hetrl.trainer.parallel.destroy_parallel``);
the pool does that too after a failed job so the next one starts clean.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import queue
import shutil
import signal
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, stacks_path: str, jobs: Any, results: Any) -> None:
    import faulthandler

    # On a timeout the parent asks for every thread's stack before it kills the world (SIGUSR1).
    faulthandler.register(signal.SIGUSR1, file=open(stacks_path, "w"), all_threads=True)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        OMP_NUM_THREADS="1",
    )
    import warnings

    import torch
    import torch.distributed as dist

    # megatron warns at import about every optional accelerator package; it drowns test output.
    warnings.filterwarnings(
        "ignore", message=".*(Transformer Engine|Apex|cuda_graph_scope|distributed_optimizer is ignored).*"
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    while True:
        job = jobs.get()
        if job is None:
            break
        fn, args = job
        try:
            results.put((rank, True, fn(rank, world_size, *args)))
        except BaseException:  # noqa: BLE001 - the parent re-raises it with the traceback
            results.put((rank, False, traceback.format_exc()))
            from hetrl.trainer.parallel import destroy_parallel

            destroy_parallel()
        gc.collect()  # a job's trainer sits in reference cycles; free its groups' threads and sockets now
    dist.destroy_process_group()


class RankPool:
    """``world_size`` long-lived gloo ranks; see the module docstring."""

    def __init__(self, world_size: int = 2) -> None:
        self.world_size = world_size
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        world_size = self.world_size
        self._jobs = [ctx.SimpleQueue() for _ in range(world_size)]
        self._results = ctx.Queue()
        port = _free_port()
        self._stacks_dir = tempfile.mkdtemp(prefix="rank_pool_stacks_")
        self._procs = [
            ctx.Process(
                target=_worker,
                daemon=True,
                args=(r, world_size, port, self._stack_file(r), self._jobs[r], self._results),
            )
            for r in range(world_size)
        ]
        for proc in self._procs:
            proc.start()

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float = 300.0) -> list[Any]:
        """Run ``fn(rank, world_size, *args)`` on every rank; the results in rank order."""
        for jobs in self._jobs:
            jobs.put((fn, args))
        out: dict[int, Any] = {}
        errors = []
        for _ in range(self.world_size):
            try:
                rank, ok, value = self._results.get(timeout=timeout_s)
            except queue.Empty:
                # A rank that failed leaves its peers blocked in a collective: start a fresh world.
                errors.append(
                    f"timed out after {timeout_s:.0f} s waiting for the other ranks; their stacks:\n" + self._stacks()
                )
                self._kill()
                self._start()
                break
            if ok:
                out[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
        if errors:
            raise RuntimeError("job failed on " + "\n".join(errors))
        return [out[r] for r in range(self.world_size)]

    def _stack_file(self, rank: int) -> str:
        return os.path.join(self._stacks_dir, f"rank{rank}.txt")

    def _stacks(self) -> str:
        """Every live rank's thread stacks, dumped by faulthandler on SIGUSR1."""
        for proc in self._procs:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(2)  # faulthandler writes from the signal handler; give it the moment it needs
        dumps = []
        for rank, proc in enumerate(self._procs):
            with open(self._stack_file(rank)) as stacks:
                dumps.append(
                    f"--- rank {rank} ({'alive' if proc.is_alive() else f'exit {proc.exitcode}'}) ---\n{stacks.read()}"
                )
        return "\n".join(dumps)

    def _kill(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=10)
        shutil.rmtree(self._stacks_dir, ignore_errors=True)

    def close(self) -> None:
        for jobs in self._jobs:
            jobs.put(None)
        for proc in self._procs:
            proc.join(timeout=30)
        self._kill()


@contextlib.contextmanager
def may_start_processes():
    """megatron's checkpoint writer starts helper processes, which a daemonic process may not
    (the RankPool's ranks are daemons so that they die with pytest): lift that for a job."""
    config = multiprocessing.current_process()._config
    was = config.get("daemon", False)
    config["daemon"] = False
    try:
        yield
    finally:
        config["daemon"] = was
