"""How environments run untrusted code: the ``CodeRunner`` interface and its sandbox backend.

Every program the policy writes (a python tool call, a code answer, a shell command) runs through a
``CodeRunner``; the shipped one is ``SandboxRunner`` over ``hetrl.sandbox`` (bubblewrap, seccomp,
rlimits, no network; see that package for what is and is not covered). The interface is one async
method so that tests and other backends (a remote sandbox service) can stand in for it.

Results are ``hetrl.sandbox.sandbox.ExecutionResult`` records; a runner never raises because of what
the program did.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the sandbox is imported lazily: building an env config must not probe bwrap
    from hetrl.sandbox.pool import SandboxPool
    from hetrl.sandbox.sandbox import ExecutionResult


class CodeRunner(Protocol):
    """Runs Python ``code`` (or ``argv``) in a fresh sandbox whose /work holds ``files``."""

    async def run(
        self,
        code: str | None = None,
        *,
        argv: list[str] | None = None,
        files: dict[str, str | bytes] | None = None,
        stdin: str | bytes | None = None,
        channel: bool = False,
    ) -> "ExecutionResult": ...


class SandboxRunner:
    """A ``CodeRunner`` over a ``SandboxPool``: executions overlap up to the pool's size.

    The pool's slots are threads waiting on sandboxed processes, so awaiting their futures keeps
    the event loop free for the other episodes.
    """

    def __init__(self, pool: "SandboxPool | None" = None, **pool_options: Any) -> None:
        if pool is None:
            from hetrl.config.reward import SandboxConfig
            from hetrl.sandbox.pool import SandboxPool

            pool = SandboxPool(SandboxConfig(**pool_options))
        elif pool_options:
            raise ValueError("pass either a SandboxPool or options to build one, not both")
        self.pool = pool

    async def run(self, code=None, *, argv=None, files=None, stdin=None, channel=False) -> "ExecutionResult":
        future = self.pool.submit(code, argv=argv, files=files, stdin=stdin, channel=channel)
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        self.pool.close()


def default_runner() -> SandboxRunner:
    """The runner environments use when none is given: a sandbox pool with the default limits."""
    return SandboxRunner()


def describe_failure(result: "ExecutionResult", max_chars: int = 1500) -> str:
    """A compact observation text for a failed execution (the tail of stderr is what explains it)."""
    if result.timeout:
        head = "timed out"
    elif result.memory_exceeded:
        head = "memory limit exceeded"
    else:
        head = f"exit code {result.exit_code} ({result.reason})"
    tail = (result.stderr or result.stdout)[-max_chars:]
    return f"{head}\n{tail}".rstrip()
