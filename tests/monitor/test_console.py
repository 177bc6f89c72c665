"""Console: plain log lines off a TTY, a rich live view (bar, metrics row, roles) on one."""

from __future__ import annotations

import io

from hetrl.config.monitor import MonitorConfig
from hetrl.monitor import Monitor
from hetrl.monitor.console import LiveConsole, PlainConsole, make_console


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _drive(stream, force_terminal):
    cfg = MonitorConfig(tensorboard=False, rollout_store={"enabled": False}, console_metrics=["reward/mean", "entropy"])
    with Monitor(
        cfg, stream.run_dir, total_steps=4, roles=["rollout"], stream=stream, force_terminal=force_terminal
    ) as mon:
        console = mon.console
        for step in range(3):
            mon.progress("rollout", tokens=500, state="generating")
            mon.log(step, {"reward/mean": 0.25 * step, "entropy": 1.5})
            mon.end_step(step)
    return console


class _Stream(io.StringIO):
    def __init__(self, run_dir):
        super().__init__()
        self.run_dir = run_dir


def test_plain_lines_when_not_a_tty(tmp_path):
    stream = _Stream(tmp_path)
    assert isinstance(_drive(stream, force_terminal=None), PlainConsole)  # StringIO is not a TTY
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("step 1/4 | reward/mean=0 entropy=1.5 | rollout=")
    assert lines[2].startswith("step 3/4 | reward/mean=0.5 ")
    assert lines[0].endswith("eta ?") and "eta " in lines[2] and "eta ?" not in lines[2]
    assert "\x1b[" not in stream.getvalue()  # no terminal escapes in logs


def test_live_view_on_a_tty(tmp_path):
    stream = _Stream(tmp_path)
    assert isinstance(_drive(stream, force_terminal=True), LiveConsole)
    out = stream.getvalue()
    for text in ("RL steps", "3/4", "reward/mean", "entropy", "0.5", "rollout", "generating", "tokens/s"):
        assert text in out, text


def test_console_off():
    assert make_console(False, 10, ["reward/mean"], io.StringIO()) is None
