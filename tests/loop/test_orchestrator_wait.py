"""The orchestrator's wait for a result backs off like any other wait on the control plane."""

import time
from types import SimpleNamespace

import pytest

from hetrl.control import comm
from hetrl.control.comm import PeerTimeout
from hetrl.loop import orchestrator


def test_an_idle_orchestrator_backs_off_to_slow_naps(monkeypatch):
    """After its first second a wait polls every 20 ms (~50 times a second); it used to start its naps
    over at every console redraw and poll every 2 ms forever. On a fake clock that its naps advance."""
    clock = [1000.0]
    polls = []

    def counting_poll(world, source=None, tag=None):
        polls.append(clock[0])

    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(orchestrator, "poll", counting_poll)
    monkeypatch.setattr(comm, "poll", counting_poll)
    redraws = []
    waiting = SimpleNamespace(
        ctx=SimpleNamespace(world=None),
        monitor=SimpleNamespace(poll=lambda: redraws.append(1)),
        _check_push_deadline=lambda: None,
    )
    with pytest.raises(PeerTimeout, match="waited 3 s"):
        orchestrator.Orchestrator.pump(waiting, "nothing", timeout_s=3.0)
    late = [t for t in polls if t - 1000.0 > 1.5]
    assert len(late) < 110, len(late)  # 1.5 s of 20 ms naps: ~75 (2 ms naps: ~750)
    assert len(redraws) >= 2  # the console still redraws every second
