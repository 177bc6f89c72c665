"""Synthetic rollouts and runs for the monitor tests (also imported by writer subprocesses)."""

from __future__ import annotations

import numpy as np

from hetrl.types import Sample

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
        samples.append(Sample(
            sample_id=f"s{step}-{i}", group_id=f"g{step}-{i // 2}", task_name="countdown" if i % 2 else "gsm",
            prompt_ids=rng.integers(0, 1000, int(rng.integers(1, 20))).tolist(),
            completion_ids=rng.integers(0, 1000, length).tolist(), loss_mask=mask.tolist(),
            logprobs=[float(x) for x in lp], versions=[int(v) for v in versions],
            finish_reason="length" if i == n - 1 else "stop",
            prompt_text=f"prompt {step}/{i} — ünïcode", completion_text=f"answer {i}" * (i + 1),
            answer={"target": i}, rewards={"correct": reward, "format": float(i % 2)}, reward=reward, flags=flags,
            num_turns=1 + i % 3, num_tool_calls=i % 2, info={"env": "t", "seed": [step, i]},
        ))
        noise = rng.normal(0.0, 0.01, length).astype(np.float32)
        trainer.append([float(x) for x in (lp + noise).astype(np.float32)])
    return samples, trainer
