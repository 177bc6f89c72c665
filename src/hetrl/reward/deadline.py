"""Call a function in a persistent worker process with a hard deadline.

Used where a library's own timeout cannot be trusted: math-verify's is ``signal.alarm``, which only
works on the main thread, and a sympy simplification can spin for minutes. A call that passes its
deadline gets its worker process killed and replaced; the caller gets ``TimeoutError``. Workers are
spawned (not forked) so they never inherit a parent's threads or locks.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
from collections.abc import Callable
from typing import Any

_CTX = mp.get_context("spawn")


_START_TIMEOUT_S = 120.0  # a cold spawn imports the function's module (sympy: seconds on a busy machine)


def _serve(conn, fn: Callable[..., Any]) -> None:
    conn.send("ready")  # unpickling ``fn`` imported its module: start-up is not billed to a call's deadline
    while True:
        try:
            args = conn.recv()
        except EOFError:
            return
        try:
            conn.send((True, fn(*args)))
        except Exception as exc:  # the error travels back; the worker keeps serving
            conn.send((False, f"{type(exc).__name__}: {exc}"))


class _Worker:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.conn, child = _CTX.Pipe()
        self.proc = _CTX.Process(target=_serve, args=(child, fn), daemon=True)
        self.proc.start()
        child.close()
        if not self.conn.poll(_START_TIMEOUT_S) or self.conn.recv() != "ready":
            self.kill()
            raise RuntimeError(f"worker did not start within {_START_TIMEOUT_S:g}s")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()


class DeadlineCaller:
    """``call(*args)`` runs the module-level (picklable) ``fn`` in one of ``workers`` processes.

    Thread-safe: concurrent callers each take a free worker. Workers start on first use.
    """

    def __init__(self, fn: Callable[..., Any], workers: int = 1, timeout_s: float = 5.0) -> None:
        if workers < 1 or timeout_s <= 0:
            raise ValueError(f"DeadlineCaller needs workers >= 1 and timeout_s > 0, got {workers}, {timeout_s}")
        self._fn = fn
        self.timeout_s = timeout_s
        self._free: queue.Queue[_Worker | None] = queue.Queue()
        for _ in range(workers):
            self._free.put(None)  # started lazily
        self._closed = threading.Event()
        self.restarts = 0

    def call(self, *args: Any) -> Any:
        if self._closed.is_set():
            raise RuntimeError("DeadlineCaller is closed")
        worker = self._free.get()
        try:
            if worker is None or not worker.proc.is_alive():
                worker = _Worker(self._fn)
            worker.conn.send(args)
            answered = worker.conn.poll(self.timeout_s)
            if answered:
                ok, value = worker.conn.recv()
            else:
                worker.kill()
                worker = None
                self.restarts += 1
        except (EOFError, OSError) as exc:
            if worker is not None:
                worker.kill()
            worker = None
            raise RuntimeError(f"worker died: {exc}") from exc
        finally:
            self._free.put(worker)
        if not answered:
            raise TimeoutError(f"call exceeded {self.timeout_s:g}s; worker killed and replaced")
        if not ok:
            raise RuntimeError(value)
        return value

    def close(self) -> None:
        self._closed.set()
        while True:
            try:
                worker = self._free.get_nowait()
            except queue.Empty:
                return
            if worker is not None:
                worker.kill()
