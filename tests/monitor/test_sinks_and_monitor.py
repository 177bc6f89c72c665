"""Sinks (JSONL, TensorBoard read back by tensorboard's own reader, W&B) and the Monitor facade."""

from __future__ import annotations

import io
import json
import math
import sys
import types

import pytest
from monitor_synth import NUM_STEPS
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hetrl.config.monitor import MonitorConfig
from hetrl.monitor import Monitor, names
from hetrl.monitor.sinks import JsonlSink, build_wandb_sink, read_jsonl

EXPECTED = [
    "reward/mean",
    "reward/std",
    "reward/min",
    "reward/max",
    "reward/correct/mean",
    "reward/format/max",
    "reward/task/gsm/mean",
    "reward/task/countdown/std",
    "response_length/mean",
    "response_length/max",
    "response_length/truncated_frac",
    "episode/turns_mean",
    "episode/tool_calls_mean",
    "flags/frac",
    "flags/format_violation_frac",
    "mismatch/prob_ratio_mean",
    "mismatch/k3_kl",
    "mismatch/max_abs_logprob_diff",
    "loss/policy",
    "entropy",
    "approx_kl",
    "grad_norm",
    "time/train",
    "time/step",
    "throughput/rollout_tokens_per_s",
    "throughput/trainer_tokens_per_s",
]


def test_jsonl_has_documented_names_every_step(synthetic_run):
    steps = read_jsonl(synthetic_run / "metrics.jsonl")
    assert list(steps) == list(range(NUM_STEPS))
    for metrics in steps.values():
        assert set(EXPECTED) <= set(metrics)
        for name in metrics:
            names.check_name(name)


def test_tensorboard_readable_by_tensorboard(synthetic_run):
    acc = EventAccumulator(str(synthetic_run / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert set(EXPECTED) <= tags
    jsonl = read_jsonl(synthetic_run / "metrics.jsonl")
    events = acc.Scalars("reward/mean")
    assert [e.step for e in events] == list(range(NUM_STEPS))
    for e in events:
        assert e.value == pytest.approx(jsonl[e.step]["reward/mean"], rel=1e-6)


def test_jsonl_keeps_nonfinite(tmp_path):
    sink = JsonlSink(tmp_path / "m.jsonl")
    sink.write(3, {"loss/policy": float("nan"), "grad_norm": float("inf")})
    sink.close()
    json.loads((tmp_path / "m.jsonl").read_text())  # strict JSON
    got = read_jsonl(tmp_path / "m.jsonl")[3]
    assert math.isnan(got["loss/policy"]) and got["grad_norm"] == math.inf


def test_unknown_metric_name_rejected(tmp_path):
    with Monitor(MonitorConfig(console=False, tensorboard=False), tmp_path, total_steps=1) as mon:
        with pytest.raises(ValueError, match="did you mean reward/mean"):
            mon.log(0, {"reward/meen": 1.0})


def test_steps_buffer_independently(tmp_path):
    with Monitor(
        MonitorConfig(console=False, tensorboard=False, rollout_store={"enabled": False}), tmp_path, total_steps=3
    ) as mon:
        mon.log(1, {"reward/mean": 1.0})  # async: next step's rollouts arrive first
        mon.log(0, {"loss/policy": 0.5})
        mon.end_step(0)
        mon.log(1, {"loss/policy": 0.25})
        mon.end_step(1)
    steps = read_jsonl(tmp_path / "metrics.jsonl")
    assert "reward/mean" not in steps[0] and steps[0]["loss/policy"] == 0.5
    assert steps[1]["reward/mean"] == 1.0 and steps[1]["loss/policy"] == 0.25
    assert not (tmp_path / "rollouts").exists()


def test_wandb_missing_warns_and_skips(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    cfg = MonitorConfig(console=False, tensorboard=False, wandb={"enabled": True})
    with pytest.warns(UserWarning, match="wandb"):
        mon = Monitor(cfg, tmp_path, total_steps=1)
    assert len(mon.sinks) == 1
    mon.close()


def test_wandb_logs_when_installed(tmp_path, monkeypatch):
    calls = []

    class FakeRun:
        def log(self, metrics, step):
            calls.append(("log", step, metrics))

        def finish(self):
            calls.append(("finish",))

    def init(**kwargs):
        calls.append(("init", kwargs))
        return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    cfg = MonitorConfig(
        console=False, tensorboard=False, wandb={"enabled": True, "project": "p", "entity": "e", "mode": "offline"}
    )
    with Monitor(cfg, tmp_path / "myrun", total_steps=1, run_config={"seed": 1}) as mon:
        mon.log(0, {"reward/mean": 0.5})
        mon.end_step(0)
    init_kwargs = calls[0][1]
    assert init_kwargs["project"] == "p" and init_kwargs["entity"] == "e" and init_kwargs["name"] == "myrun"
    assert init_kwargs["mode"] == "offline" and init_kwargs["config"] == {"seed": 1}
    assert calls[1][0] == "log" and calls[1][1] == 0 and calls[1][2]["reward/mean"] == 0.5
    assert calls[-1] == ("finish",)
    assert build_wandb_sink(MonitorConfig().wandb, tmp_path) is None  # disabled by default


def test_config_strict_and_documented():
    with pytest.raises(ValueError, match="extra"):
        MonitorConfig(consol=True)
    with pytest.raises(ValueError):
        MonitorConfig(guards={"nonfinite_loss": {"action": "explode"}})

    def walk(model):
        for name, field in type(model).model_fields.items():
            assert field.description, f"{type(model).__name__}.{name} has no description"
            value = getattr(model, name)
            if hasattr(type(value), "model_fields"):
                walk(value)

    walk(MonitorConfig())


def test_bad_console_metric_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown metric"):
        Monitor(MonitorConfig(console_metrics=["rewrd/mean"]), tmp_path, total_steps=1, stream=io.StringIO())
