"""Pre-emption: SIGTERM/SIGUSR1 mean "checkpoint at the next safe point, then exit for a requeue".

No rank dies on the signal. Each rank's handler only records it; a rank other than the
orchestrator also tells the orchestrator (one small control-plane message), because on a cluster
the signal may reach only some ranks. The orchestrator checks :func:`requested` at its safe points
(between two steps), has the trainer save a checkpoint, shuts every role down and raises
:class:`Preempted`; the worker's main turns that into :data:`hetrl.control.rundir.REQUEUE_EXIT_CODE`.

Exit ordering: every non-orchestrator rank says :class:`Bye` when its role returned, and the
orchestrator exits only after hearing from all of them (bounded wait). Under ``srun
--kill-on-bad-exit`` the orchestrator's non-zero requeue code would otherwise kill ranks that are
still shutting down, and the step's exit code would be the kill's, not the requeue code.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from typing import Any

from hetrl.control import rundir
from hetrl.control.comm import RoleContext, Tag, envelope, naps, poll, send
from hetrl.control.protocol import Bye, PreemptNotice

logger = logging.getLogger(__name__)
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
__all__ = [
    "Bye",
    "PreemptNotice",
    "Preempted",
    "install_handlers",
    "mark_requeue",
    "requested",
    "say_bye",
    "wait_for_byes",
]

_received: list[int] = []  # signals this process got (process-global, like signal handlers)
_notices: list[Any] = []  # isend requests of notices to the orchestrator (kept alive until sent)


class Preempted(Exception):
    """The run stopped early at a safe point after a pre-emption signal; a checkpoint exists."""

    def __init__(self, signum: int, checkpoint: str | None) -> None:
        super().__init__(f"pre-empted by signal {signum}; checkpoint: {checkpoint}")
        self.signum, self.checkpoint = signum, checkpoint


def mark_requeue(run_dir: Path, checkpoint: str | None) -> None:
    """Orchestrator: record in the run directory that the job stopped at ``checkpoint`` for a requeue."""
    (Path(run_dir) / rundir.REQUEUE_MARKER).write_text(f"{checkpoint}\n")


def install_handlers(ctx: RoleContext) -> None:
    """Record SIGTERM/SIGUSR1 instead of dying; non-orchestrator ranks notify the orchestrator."""

    def handler(signum: int, _frame: Any) -> None:
        first = not _received
        _received.append(signum)
        logger.warning("received signal %d: checkpoint at the next safe point, then exit", signum)
        if first and ctx.role != "orchestrator":
            # Handlers run between two bytecodes of the main thread, never inside an MPI call.
            _notices.append(
                ctx.world.isend(envelope(PreemptNotice(signum)), dest=ctx.orchestrator_rank, tag=int(Tag.CONTROL))
            )

    for sig in PREEMPTION_SIGNALS:
        signal.signal(sig, handler)


def requested(ctx: RoleContext) -> int | None:
    """The orchestrator's check at a safe point: the signal number if any rank was signalled."""
    while (got := poll(ctx.world, tag=Tag.CONTROL)) is not None:
        message, source, _ = got
        if not isinstance(message, PreemptNotice):
            raise TypeError(
                f"orchestrator got an unexpected {type(message).__name__} from rank {source} on the control tag"
            )
        logger.warning("rank %d received signal %d", source, message.signum)
        _received.append(message.signum)
    return _received[0] if _received else None


def say_bye(ctx: RoleContext) -> None:
    send(ctx.world, Bye(), ctx.orchestrator_rank, Tag.CONTROL)


def wait_for_byes(ctx: RoleContext, timeout_s: float = 60.0) -> None:
    """Orchestrator: wait (sleeping ``comm.naps``) until every other rank said :class:`Bye`, at most ``timeout_s``."""
    missing = set(range(ctx.world.Get_size())) - {ctx.rank}
    deadline = time.monotonic() + timeout_s
    pauses = naps()
    while missing and (now := time.monotonic()) < deadline:
        got = poll(ctx.world, tag=Tag.CONTROL)
        if got is None:
            time.sleep(min(next(pauses), deadline - now))
        elif isinstance(got[0], Bye):
            missing.discard(got[1])
    if missing:
        logger.warning("ranks %s did not say bye within %.0f s; exiting anyway", sorted(missing), timeout_s)
