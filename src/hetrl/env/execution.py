"""How environments run untrusted code: the ``CodeRunner`` interface and its sandbox backend.

Every program the policy writes (a python tool call, a code answer, a shell command) runs through a
``CodeRunner``; the shipped one is ``SandboxRunner`` over ``hetrl.sandbox`` (bubblewrap, seccomp,
rlimits, no network; see that package for what is and is not covered). The interface is one async
method so that tests and other backends (a remote sandbox service) can stand in for it.

Results are ``hetrl.sandbox.sandbox.ExecutionResult`` records; a runner never raises because of what
the program did.

Settings: the environments' sandbox follows the recipe's ``reward.sandbox`` (limits, workers,
python, ro_binds, allow_unisolated, seccomp, uid_base), the same section the code reward reads:
the roles hand it to ``hetrl.env.registry.env_factory``, whose process-wide runner is built from it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from hetrl.config.reward import SandboxConfig
from hetrl.sandbox.pool import SandboxPool

if TYPE_CHECKING:  # the sandbox is imported lazily: building an env config must not probe bwrap
    from hetrl.config.reward import SandboxConfig
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
    ) -> ExecutionResult: ...


class SandboxRunner:
    """A ``CodeRunner`` over a ``SandboxPool``: executions overlap up to the pool's size.

    The pool's slots are threads waiting on sandboxed processes, so awaiting their futures keeps
    the event loop free for the other episodes.
    """

    def __init__(
        self, pool: SandboxPool | None = None, config: SandboxConfig | None = None, **pool_options: Any
    ) -> None:
        """Over ``pool``, or a pool built from ``config`` (a ``SandboxConfig``) or from ``pool_options`` (its
        fields)."""
        if (pool is not None) + (config is not None) + bool(pool_options) > 1:
            raise ValueError("pass one of a SandboxPool, a SandboxConfig or options to build one")
        if pool is None:
            pool = SandboxPool(config if config is not None else SandboxConfig(**pool_options))
        self.pool = pool

    async def run(self, code=None, *, argv=None, files=None, stdin=None, channel=False) -> ExecutionResult:
        future = self.pool.submit(code, argv=argv, files=files, stdin=stdin, channel=channel)
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        self.pool.close()


def describe_failure(result: ExecutionResult, max_chars: int = 1500) -> str:
    """A compact observation text for a failed execution (the tail of stderr is what explains it)."""
    if result.timeout:
        head = "timed out"
    elif result.memory_exceeded:
        head = "memory limit exceeded"
    else:
        head = f"exit code {result.exit_code} ({result.reason})"
    tail = (result.stderr or result.stdout)[-max_chars:]
    return f"{head}\n{tail}".rstrip()
