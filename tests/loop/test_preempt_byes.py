"""The orchestrator's last wait, for every other rank's Bye: bounded, and backing off like every control-plane wait."""

from __future__ import annotations

import time
from types import SimpleNamespace

from hetrl.control.protocol import Bye
from hetrl.loop import preempt


def _ctx(world_size: int) -> SimpleNamespace:
    return SimpleNamespace(world=SimpleNamespace(Get_size=lambda: world_size), rank=0)


def _on_a_fake_clock(monkeypatch, arrivals: dict[float, tuple]) -> list[float]:
    """``arrivals``: fake time -> the message that has arrived by then; the times of the polls, returned."""
    clock, polls = [0.0], []

    def poll(world, source=None, tag=None):
        polls.append(clock[0])
        due = [t for t in arrivals if t <= clock[0]]
        return arrivals.pop(min(due)) if due else None

    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(preempt, "poll", poll)
    return polls


def test_it_ends_when_every_other_rank_said_bye(monkeypatch):
    polls = _on_a_fake_clock(monkeypatch, {0.5: (Bye(), 2, 12), 0.0: (Bye(), 1, 12)})
    preempt.wait_for_byes(_ctx(3), timeout_s=60.0)
    assert 0.5 <= polls[-1] < 0.6


def test_a_rank_that_never_says_bye_is_waited_for_until_the_deadline_with_slow_naps(monkeypatch):
    polls = _on_a_fake_clock(monkeypatch, {0.0: (Bye(), 1, 12)})
    preempt.wait_for_byes(_ctx(3), timeout_s=60.0)
    assert 59.9 < polls[-1] <= 60.0
    late = [t for t in polls if t > 1.5]
    assert len(late) < 3200, len(late)  # 20 ms naps after the first second: ~2,925 (the old 10 ms: 5,850)
