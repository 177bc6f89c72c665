"""Each guard fires on a metric stream rigged to trip it, stays quiet on a healthy one, and `stop` stops."""

from __future__ import annotations

import io
import json
import math

import pytest

from hetrl.config.monitor import GuardsConfig, MonitorConfig
from hetrl.monitor import GuardStop, Monitor
from hetrl.monitor.guards import Guards


def _healthy(step: int) -> dict[str, float]:
    return {
        "loss/policy": 0.1,
        "grad_norm": 1.0,
        "reward/mean": 0.2 + 0.01 * step,
        "entropy": 1.5,
        "mismatch/k3_kl": 1e-3 * (1 + step % 3),
    }


def _stream(guards: Guards, rig, steps: int = 40) -> list:
    alerts = []
    for step in range(steps):
        metrics = _healthy(step)
        rig(step, metrics)
        alerts += guards.check(step, metrics)
    return alerts


def test_quiet_on_healthy_stream():
    assert _stream(Guards(GuardsConfig()), lambda step, m: None) == []


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nonfinite_loss(bad):
    def rig(step, m):
        if step == 7:
            m["loss/policy"] = bad
        if step == 9:
            m["grad_norm"] = bad

    alerts = _stream(Guards(GuardsConfig()), rig)
    assert [(a.guard, a.step, a.action) for a in alerts] == [
        ("nonfinite_loss", 7, "stop"),
        ("nonfinite_loss", 9, "stop"),
    ]


def test_reward_collapse_fires_once_and_rearms():
    cfg = GuardsConfig(reward_collapse={"window": 3, "max_drop": 0.3})

    def rig(step, m):
        if 15 <= step < 25 or step >= 32:
            m["reward/mean"] = 0.0

    alerts = _stream(Guards(cfg), rig)
    assert [a.guard for a in alerts] == ["reward_collapse", "reward_collapse"]
    assert [a.step for a in alerts] == [17, 33]  # once per collapse: when the 3-step mean is > 0.3 below its best


def test_entropy_collapse_after_patience():
    cfg = GuardsConfig(entropy_collapse={"min_entropy": 0.05, "patience": 4})

    def rig(step, m):
        if step >= 10:
            m["entropy"] = 0.01
        if step == 11:
            m["entropy"] = 0.5  # one healthy step resets the count

    alerts = _stream(Guards(cfg), rig)
    assert [(a.guard, a.step) for a in alerts] == [("entropy_collapse", 15)]


def test_mismatch_absolute_and_relative_spike():
    cfg = GuardsConfig(mismatch_spike={"max_k3_kl": 0.05, "spike_factor": 10.0, "window": 5})

    def rig(step, m):
        if step == 20:
            m["mismatch/k3_kl"] = 0.2  # above the ceiling
        if step == 30:
            m["mismatch/k3_kl"] = 0.03  # under the ceiling but > 10x the ~2e-3 median

    alerts = _stream(Guards(cfg), rig)
    assert [(a.guard, a.step) for a in alerts] == [("mismatch_spike", 20), ("mismatch_spike", 30)]
    assert "max_k3_kl" in alerts[0].message and "median" in alerts[1].message


def test_disabled_guard_is_silent():
    cfg = GuardsConfig(nonfinite_loss={"enabled": False})
    assert _stream(Guards(cfg), lambda step, m: m.update({"loss/policy": math.nan})) == []


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_silent_role_raises_no_alert(tmp_path):
    """Hangs are the liveness watchdog's (docs/hangs.md): the monitor's poll only redraws the console."""
    clock = FakeClock()
    with Monitor(
        MonitorConfig(tensorboard=False), tmp_path, total_steps=1, roles=["reward"], stream=io.StringIO(), clock=clock
    ) as mon:
        mon.progress("reward", state="scoring")
        clock.now += 10_000
        mon.poll()
        mon.log(0, {"loss/policy": 0.1})
        mon.end_step(0)
    assert (tmp_path / "alerts.jsonl").read_text() == ""


def test_stop_action_raises_after_step_is_written(tmp_path):
    stream = io.StringIO()
    with Monitor(MonitorConfig(tensorboard=False), tmp_path, total_steps=5, stream=stream) as mon:
        mon.log(0, {"loss/policy": 0.1})
        mon.end_step(0)
        mon.log(1, {"loss/policy": math.nan})
        with pytest.raises(GuardStop, match="nonfinite_loss") as exc:
            mon.end_step(1)
    assert exc.value.alerts[0].step == 1
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["loss/policy"] == "nan"  # the evidence is on disk
    assert "[STOP] nonfinite_loss: step 1" in stream.getvalue()


def test_warn_action_does_not_raise(tmp_path):
    cfg = MonitorConfig(
        console=False, tensorboard=False, guards={"entropy_collapse": {"patience": 1, "action": "warn"}}
    )
    with Monitor(cfg, tmp_path, total_steps=2) as mon:
        mon.log(0, {"entropy": 0.0})
        mon.end_step(0)
    assert json.loads((tmp_path / "alerts.jsonl").read_text())["guard"] == "entropy_collapse"
