"""Synthetic rollouts and runs for the monitor tests (also imported by writer subprocesses)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from hetrl.config.monitor import MonitorConfig
from hetrl.monitor import Monitor, names
from hetrl.monitor.mismatch import mismatch_metrics
from hetrl.monitor.rollout_store import ROLLOUT_DIR, RolloutStore
from hetrl.records import Sample, SampleMeta

FLAGS = ("format_violation", "repeated_answer")


def make_samples(step: int, n: int = 6, seed: int = 0) -> tuple[list[Sample], list[list[float]]]:
    """n samples of one step plus trainer log-probs; log-probs are float32-exact like real engines'."""
    rng = np.random.default_rng([seed, step])
    samples, trainer = [], []
    for i in range(n):
        length = int(rng.integers(3, 40))
        lp = rng.normal(-1.0, 0.5, length).astype(np.float32)
        mask = (rng.random(length) > 0.2).astype(int)
        versions = np.where(mask == 1, step - int(rng.integers(0, 2)), -1)
        flags = [FLAGS[i % 2]] if i % 3 == 0 else []
        reward = float(rng.random()) + 0.1 * step
        samples.append(
            Sample(
                sample_id=f"s{step}-{i}",
                group_id=f"g{step}-{i // 2}",
                task_name="countdown" if i % 2 else "gsm",
                prompt_ids=rng.integers(0, 1000, int(rng.integers(1, 20))).tolist(),
                completion_ids=rng.integers(0, 1000, length).tolist(),
                loss_mask=mask.tolist(),
                logprobs=[float(x) for x in lp],
                versions=[int(v) for v in versions],
                finish_reason="length" if i == n - 1 else "stop",
                prompt_text=f"prompt {step}/{i} — ünïcode",
                completion_text=f"answer {i}" * (i + 1),
                answer={"target": i},
                rewards={"correct": reward, "format": float(i % 2)},
                reward=reward,
                flags=flags,
                num_turns=1 + i % 3,
                num_tool_calls=i % 2,
                info={"env": "t", "seed": [step, i]},
            )
        )
        noise = rng.normal(0.0, 0.01, length).astype(np.float32)
        trainer.append([float(x) for x in (lp + noise).astype(np.float32)])
    return samples, trainer


NUM_STEPS = 6


def write_run(run_dir: Path, num_steps: int = NUM_STEPS, **cfg_overrides) -> Path:
    """A run of `num_steps` steps with rollouts (stored as the trainer's one replica stores them), trainer-side
    metrics (the mismatch among them) and role throughput."""
    cfg = MonitorConfig(console=True, **cfg_overrides)
    stream = io.StringIO()
    store = RolloutStore(run_dir / ROLLOUT_DIR) if cfg.rollout_store.enabled else None
    with Monitor(cfg, run_dir, total_steps=num_steps, roles=["rollout", "trainer"], stream=stream) as mon:
        for step in range(num_steps):
            samples, trainer_lp = make_samples(step)
            mon.progress("rollout", tokens=sum(len(s.completion_ids) for s in samples), state="generating")
            with mon.timer(step, "train"):
                mon.progress("trainer", tokens=100, state="training")
            if store is not None:
                store.append(step, samples, trainer_lp)
            mon.record_rollouts(step, [SampleMeta.of(s) for s in samples])
            mon.log(step, mismatch_metrics([s.logprobs for s in samples], trainer_lp, [s.loss_mask for s in samples]))
            mon.log(
                step,
                {
                    names.LOSS_POLICY: 0.1 / (step + 1),
                    names.ENTROPY: 2.0 - 0.1 * step,
                    names.APPROX_KL: 0.01 * step,
                    names.GRAD_NORM: 1.0,
                },
            )
            mon.end_step(step)
    if store is not None:
        store.close()
    return run_dir
