"""Shared fixtures: a synthetic run directory written through the real Monitor."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from monitor_synth import make_samples

from hetrl.config.monitor import MonitorConfig
from hetrl.monitor import Monitor, names

NUM_STEPS = 6


def write_run(run_dir: Path, num_steps: int = NUM_STEPS, **cfg_overrides) -> Path:
    """A run of `num_steps` steps with rollouts, trainer-side metrics and role throughput."""
    cfg = MonitorConfig(console=True, **cfg_overrides)
    stream = io.StringIO()
    with Monitor(cfg, run_dir, total_steps=num_steps, roles=["rollout", "trainer"], stream=stream) as mon:
        for step in range(num_steps):
            samples, trainer_lp = make_samples(step)
            mon.progress("rollout", tokens=sum(len(s.completion_ids) for s in samples), state="generating")
            with mon.timer(step, "train"):
                mon.progress("trainer", tokens=100, state="training")
            mon.record_rollouts(step, samples, trainer_lp)
            mon.log(step, {names.LOSS_POLICY: 0.1 / (step + 1), names.ENTROPY: 2.0 - 0.1 * step,
                           names.APPROX_KL: 0.01 * step, names.GRAD_NORM: 1.0})
            mon.end_step(step)
    return run_dir


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("run") / "tiny")
