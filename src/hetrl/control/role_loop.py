"""Every role's main loop: messages to handlers by type, the role's own work, liveness, naps.

A role is a handler table over :class:`RoleLoop`: each round takes every message that arrived (one
tag, from one peer or anyone) to the handler of its type, in arrival order, then lets the role move
its own work (a client's pump, an answer sent, a decoding step), then reports liveness and naps.

Why one loop (the MPICH facts in ``hetrl.control.comm``'s docstring apply): nothing blocks inside
MPI, so every wait is a poll and a sleep; each role used to write that loop itself, with its own
back-off constants, and missed ``comm.naps``' restart when a message matched. Here a round that
moved starts fresh naps (the next message is likely on its way: it is seen within ~2 ms), and one
that did not sleeps the next nap, or less if ``wake`` is set (a scoring thread asked for something
only this thread can send).

Liveness is reported from this thread only (a beacon record is replaced whole): a role with nothing
in hand is idle; one holding work reports busy only in a round that moved, because a busy report
counts as progress, so a rank stuck with work goes stale and the watchdog names it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from hetrl.control import liveness
from hetrl.control.comm import RoleContext, Tag, naps, poll

Handler = Callable[[Any, int], None]  # (message, source world rank)


def _nothing_moved() -> bool:
    return False


def _no_activity() -> str | None:
    return None


class RoleLoop:
    """Poll rounds for one role; a handler sets :attr:`stop` (on Shutdown) to end :meth:`run`/:meth:`arun`."""

    def __init__(
        self,
        ctx: RoleContext,
        handlers: Mapping[type, Handler],
        *,
        tag: Tag = Tag.WORK,
        source: int | None = None,
        wake: threading.Event | None = None,
    ) -> None:
        self.ctx, self.handlers = ctx, dict(handlers)
        self.tag, self.source, self.wake = tag, source, wake
        self.stop = False

    def receive(self) -> bool:
        """Every message that arrived (this tag, from ``source`` or anyone) to its handler, in arrival order; a type
        with no handler raises TypeError naming this role, the type and the sender. True if any arrived."""
        got_any = False
        while (got := poll(self.ctx.world, self.source, self.tag)) is not None:
            message, source, _ = got
            got_any = True
            self.handle(message, source)
        return got_any

    def handle(self, message: Any, source: int) -> None:
        """``message`` to the handler of its type, for :meth:`receive` and for a role that waits on its own: the
        trainer ranks take the leader's message through a broadcast, the orchestrator one result at a time."""
        handler = self.handlers.get(type(message))
        if handler is None:
            raise TypeError(
                f"{self.ctx.role}[{self.ctx.assignment.role_rank}] got an unexpected {type(message).__name__} "
                f"from world rank {source} (it handles {sorted(t.__name__ for t in self.handlers)})"
            )
        handler(message, source)

    def _report(self, moved: bool, activity: Callable[[], str | None], idle: str | Callable[[], str]) -> None:
        what = activity()
        if what is None:
            liveness.idle(idle() if callable(idle) else idle)
        elif moved:
            liveness.busy(what)

    def run(
        self,
        work: Callable[[], bool] = _nothing_moved,
        activity: Callable[[], str | None] = _no_activity,
        idle: str | Callable[[], str] = "waiting for work",
    ) -> None:
        """Rounds until :attr:`stop`: :meth:`receive`, then ``work()`` (the role's own progress; True if it moved),
        liveness (``activity()``: None when the role holds nothing, else what it is busy with; ``idle``, or what it
        returns, is what an idle role waits for), then a nap unless the round moved. The nap ends early when ``wake``
        is set (it is cleared then)."""
        pauses = naps()
        while True:
            moved = self.receive()
            moved = work() or moved
            self._report(moved, activity, idle)
            if self.stop:
                return
            if moved:
                pauses = naps()
            elif self.wake is not None:
                self.wake.wait(next(pauses))
                self.wake.clear()
            else:
                time.sleep(next(pauses))

    async def arun(
        self,
        work: Callable[[], Awaitable[bool]],
        activity: Callable[[], str | None] = _no_activity,
        idle: str | Callable[[], str] = "waiting for work",
        *,
        awake: asyncio.Event | None = None,
    ) -> None:
        """The rounds of :meth:`run` on an asyncio loop: a round that moved yields once (``asyncio.sleep(0)``: the
        tasks it woke take their turn), one that did not sleeps the next nap, or until ``awake`` is set (a task on
        this loop finished something to send; it is cleared then)."""
        pauses = naps()
        while True:
            moved = self.receive()
            moved = await work() or moved
            self._report(moved, activity, idle)
            if self.stop:
                return
            if moved:
                pauses = naps()
                await asyncio.sleep(0)
            elif awake is not None:
                try:
                    await asyncio.wait_for(awake.wait(), timeout=next(pauses))
                except TimeoutError:
                    pass
                awake.clear()
            else:
                await asyncio.sleep(next(pauses))
