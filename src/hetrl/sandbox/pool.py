"""A fixed set of sandbox slots serving executions concurrently from threads.

Each slot is a ``Sandbox`` with its own uid (as root), so one program's fork bomb exhausts only
its own slot's process budget. Executions are processes, so threads are enough to overlap them;
a slot is returned to the pool after every run whatever the program did, which is what keeps the
pool serving after hostile programs.
"""

from __future__ import annotations

import queue
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from hetrl.config.reward import SandboxConfig
from hetrl.sandbox.isolation import IsolationReport, detect_isolation, require_isolation
from hetrl.sandbox.sandbox import ExecutionResult, Sandbox


class SandboxPool:
    """``run`` blocks for a free slot; ``submit`` returns a Future. Use as a context manager or call ``close``."""

    def __init__(self, config: SandboxConfig | None = None, isolation: IsolationReport | None = None) -> None:
        self.config = config or SandboxConfig()
        self.isolation = isolation or detect_isolation()
        require_isolation(self.isolation, self.config.allow_unisolated)
        self._slots: queue.Queue[Sandbox] = queue.Queue()
        for slot in range(self.config.workers):
            self._slots.put(Sandbox(self.config, slot=slot, isolation=self.isolation))
        self._executor = ThreadPoolExecutor(max_workers=self.config.workers, thread_name_prefix="sandbox")

    @property
    def size(self) -> int:
        return self.config.workers

    def run(self, code: str | None = None, **kwargs: Any) -> ExecutionResult:
        """Same arguments as ``Sandbox.run``; runs in the calling thread on the next free slot."""
        sandbox = self._slots.get()
        try:
            return sandbox.run(code, **kwargs)
        finally:
            self._slots.put(sandbox)

    def submit(self, code: str | None = None, **kwargs: Any) -> Future[ExecutionResult]:
        return self._executor.submit(self.run, code, **kwargs)

    def map(self, jobs: list[dict[str, Any]]) -> list[ExecutionResult]:
        """Run each job (``Sandbox.run`` keyword arguments) concurrently; results in job order."""
        futures = [self.submit(**job) for job in jobs]
        return [f.result() for f in futures]

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
