"""RoleLoop without MPI: a scripted poll, recorded liveness reports and counted naps."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from hetrl.control import role_loop
from hetrl.control.comm import Tag
from hetrl.control.role_loop import RoleLoop


@dataclass
class Ping:
    n: int


@dataclass
class Stop:
    pass


class Rig:
    """Rounds of scripted arrivals, and what the loop did with them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, rounds: list[list[tuple[object, int]]]) -> None:
        self.rounds = [list(r) for r in rounds]
        self.polls: list[tuple[int | None, Tag | None]] = []
        self.reports: list[tuple[str, str]] = []
        self.naps_started = 0
        self.nap_s = 0.0
        self.naps_taken: list[tuple[int, int]] = []  # (which naps(), which nap of it)
        monkeypatch.setattr(role_loop, "poll", self.poll)
        monkeypatch.setattr(role_loop, "naps", self.naps)
        monkeypatch.setattr(role_loop.liveness, "idle", lambda what: self.reports.append(("idle", what)))
        monkeypatch.setattr(role_loop.liveness, "busy", lambda what: self.reports.append(("busy", what)))
        monkeypatch.setattr(role_loop.time, "sleep", lambda s: None)
        self.ctx = SimpleNamespace(world="world", role="reward", assignment=SimpleNamespace(role_rank=2))

    def poll(self, comm, source=None, tag=None):
        assert comm == "world"
        self.polls.append((source, tag))
        if self.rounds and self.rounds[0]:
            message, sender = self.rounds[0].pop(0)
            return message, sender, int(tag)
        if self.rounds:
            self.rounds.pop(0)  # this round's arrivals are all in: the next poll is the next round's
        return None

    def naps(self):
        self.naps_started += 1
        return self._naps(self.naps_started)

    def _naps(self, generation: int):
        index = 0
        while True:
            self.naps_taken.append((generation, index))
            index += 1
            yield self.nap_s


def test_receive_hands_each_message_to_its_types_handler_in_arrival_order(monkeypatch):
    rig = Rig(monkeypatch, [[(Ping(1), 5), (Stop(), 6), (Ping(2), 7)]])
    seen = []
    loop = RoleLoop(
        rig.ctx,
        {Ping: lambda m, s: seen.append(("ping", m.n, s)), Stop: lambda m, s: seen.append(("stop", s))},
        tag=Tag.RESULT,
        source=9,
    )
    assert loop.receive() is True
    assert seen == [("ping", 1, 5), ("stop", 6), ("ping", 2, 7)]
    assert rig.polls == [(9, Tag.RESULT)] * 4
    assert loop.receive() is False


def test_a_message_without_a_handler_names_the_role_the_type_and_the_sender(monkeypatch):
    rig = Rig(monkeypatch, [[(Stop(), 11)]])
    loop = RoleLoop(rig.ctx, {Ping: lambda m, s: None})
    with pytest.raises(TypeError, match=r"reward\[2\] got an unexpected Stop from world rank 11"):
        loop.receive()


def test_run_ends_after_the_round_in_which_a_handler_set_stop(monkeypatch):
    rig = Rig(monkeypatch, [[], [(Ping(1), 3)], [(Stop(), 3)], [(Ping(2), 3)]])
    seen = []
    loop = RoleLoop(rig.ctx, {Ping: lambda m, s: seen.append(m.n), Stop: lambda m, s: setattr(loop, "stop", True)})
    work_rounds = []
    loop.run(work=lambda: work_rounds.append(loop.stop) or False)
    assert seen == [1]  # the Ping after Stop is never taken
    assert work_rounds == [False, False, True]  # the stopping round still does its work


def test_idle_when_holding_nothing_busy_only_in_rounds_that_moved(monkeypatch):
    # rounds: nothing; a message; nothing (holding work); work moved; nothing, holding nothing; stop
    rig = Rig(monkeypatch, [[], [(Ping(1), 3)], [], [], [], [(Stop(), 3)]])
    holding = iter([None, "scoring 1", "scoring 1", "scoring 1", None, None])
    moves = iter([False, False, False, True, False, False])
    loop = RoleLoop(rig.ctx, {Ping: lambda m, s: None, Stop: lambda m, s: setattr(loop, "stop", True)})
    loop.run(work=lambda: next(moves), activity=lambda: next(holding), idle="waiting for samples")
    assert rig.reports == [
        ("idle", "waiting for samples"),
        ("busy", "scoring 1"),  # a message arrived
        ("busy", "scoring 1"),  # the work moved; the round between, stuck, reported nothing
        ("idle", "waiting for samples"),
        ("idle", "waiting for samples"),
    ]


def test_a_round_that_moved_starts_fresh_naps(monkeypatch):
    rig = Rig(monkeypatch, [[], [], [(Ping(1), 3)], [], [], [(Stop(), 3)]])
    loop = RoleLoop(rig.ctx, {Ping: lambda m, s: None, Stop: lambda m, s: setattr(loop, "stop", True)})
    loop.run()
    # two naps of the first wait, the Ping's round naps not and starts a new wait: its first nap, then its second
    assert rig.naps_started == 2 and rig.naps_taken == [(1, 0), (1, 1), (2, 0), (2, 1)]


def test_wake_cuts_a_nap_short_and_is_cleared(monkeypatch):
    rig = Rig(monkeypatch, [[], [(Stop(), 3)]])
    wake = threading.Event()
    wake.set()
    waits = []
    monkeypatch.setattr(wake, "wait", lambda timeout: waits.append(timeout) or True)
    loop = RoleLoop(rig.ctx, {Stop: lambda m, s: setattr(loop, "stop", True)}, wake=wake)
    loop.run()
    assert waits == [0.0] and not wake.is_set()


def test_arun_yields_to_the_tasks_a_moving_round_woke_and_wakes_on_awake(monkeypatch):
    rig = Rig(monkeypatch, [[(Ping(1), 3)], [], [(Stop(), 3)]])
    rig.nap_s = 30.0  # the one nap, in the second round, is cut short by the answer
    order = []

    async def main():
        awake = asyncio.Event()

        async def answer():  # an env call completing on the role's loop
            order.append("answered")
            awake.set()

        async def work():
            order.append("work")
            return False

        loop = RoleLoop(
            rig.ctx,
            {
                Ping: lambda m, s: asyncio.get_running_loop().create_task(answer()),
                Stop: lambda m, s: setattr(loop, "stop", True),
            },
        )
        await loop.arun(work, idle="waiting for env calls", awake=awake)
        return awake.is_set()

    start = time.monotonic()
    assert asyncio.run(main()) is False
    assert time.monotonic() - start < 10.0
    assert order == ["work", "answered", "work", "work"]
    assert rig.reports == [("idle", "waiting for env calls")] * 3
    assert rig.naps_taken == [(2, 0)]  # the Ping's round restarted the naps


def test_handle_dispatches_one_message_without_polling(monkeypatch):
    """For a role that waits on its own (the trainer's broadcast, the orchestrator's one result at a time)."""
    rig = Rig(monkeypatch, [])
    seen = []
    loop = RoleLoop(rig.ctx, {Ping: lambda m, s: seen.append((m.n, s))})
    loop.handle(Ping(4), 8)
    assert seen == [(4, 8)] and rig.polls == []
    with pytest.raises(
        TypeError, match=r"reward\[2\] got an unexpected Stop from world rank 8 \(it handles \['Ping'\]"
    ):
        loop.handle(Stop(), 8)


def test_an_idle_callable_says_each_round_what_the_role_waits_for(monkeypatch):
    rig = Rig(monkeypatch, [[], [], [(Stop(), 3)]])
    waiting_for = iter(["episodes", "the trainer's step", "episodes"])
    loop = RoleLoop(rig.ctx, {Stop: lambda m, s: setattr(loop, "stop", True)})
    loop.run(idle=lambda: next(waiting_for))
    assert rig.reports == [("idle", "episodes"), ("idle", "the trainer's step"), ("idle", "episodes")]
