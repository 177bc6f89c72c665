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
    return {"loss/policy": 0.1, "grad_norm": 1.0, "reward/mean": 0.2 + 0.01 * step, "entropy": 1.5, "mismatch/k3_kl": 1e-3 * (1 + step % 3)}


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
    assert [(a.guard, a.step, a.action) for a in alerts] == [("nonfinite_loss", 7, "stop"), ("nonfinite_loss", 9, "stop")]


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


def test_stalled_role_via_monitor_poll(tmp_path):
    clock = FakeClock()
    cfg = MonitorConfig(console=False, tensorboard=False, guards={"stalled_role": {"timeout_s": 60, "action": "warn"}})
    with Monitor(cfg, tmp_path, total_steps=10, roles=["rollout", "trainer"], clock=clock) as mon:
        clock.now += 30
        mon.progress("trainer", tokens=10)
        assert mon.poll() == []
        clock.now += 40  # rollout idle 70 s, trainer 40 s
        alerts = mon.poll()
        assert [(a.guard, a.message.split("'")[1]) for a in alerts] == [("stalled_role", "rollout")]
        assert mon.poll() == []  # same stall is not re-reported
        mon.progress("rollout")
        clock.now += 61
        assert sorted(a.message.split("'")[1] for a in mon.poll()) == ["rollout", "trainer"]
    lines = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert [line["guard"] for line in lines] == ["stalled_role"] * 3


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
    cfg = MonitorConfig(console=False, tensorboard=False, guards={"entropy_collapse": {"patience": 1, "action": "warn"}})
    with Monitor(cfg, tmp_path, total_steps=2) as mon:
        mon.log(0, {"entropy": 0.0})
        mon.end_step(0)
    assert json.loads((tmp_path / "alerts.jsonl").read_text())["guard"] == "entropy_collapse"


def test_idle_role_is_not_stalled(tmp_path):
    """A role waiting for work may wait forever; once given work, its stall clock starts then."""
    clock = FakeClock()
    cfg = MonitorConfig(console=False, tensorboard=False, guards={"stalled_role": {"timeout_s": 60, "action": "warn"}})
    with Monitor(cfg, tmp_path, total_steps=10, roles=["trainer"], clock=clock) as mon:
        mon.progress("trainer", state="idle")
        clock.now += 600
        assert mon.poll() == []
        mon.progress("trainer", state="training")
        clock.now += 59
        assert mon.poll() == []
        clock.now += 2
        assert [a.guard for a in mon.poll()] == ["stalled_role"]


def test_stall_stop_raises_from_poll(tmp_path):
    clock = FakeClock()
    cfg = MonitorConfig(console=False, tensorboard=False, guards={"stalled_role": {"timeout_s": 5}})
    with Monitor(cfg, tmp_path, total_steps=1, roles=["reward"], clock=clock) as mon:
        clock.now += 6
        with pytest.raises(GuardStop, match="role 'reward'"):
            mon.poll()
