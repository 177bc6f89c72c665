"""The OpenEnv recipe end to end through launch.py (tiny_openenv_grpo): each rank that runs episodes
serves the shipped guess-the-number app itself, and the game's rewards reach the trainer."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.mpi, pytest.mark.vllm, pytest.mark.slow]


def test_tiny_openenv_grpo_runs_and_records_the_games_rewards(tmp_path):
    # Three steps and a small eval: this runs in CI's slow pass (2m13s for the recipe's 6 steps on 2 cores).
    cmd = [
        sys.executable,
        str(ROOT / "launch.py"),
        "recipe=tiny_openenv_grpo",
        f"run.output_dir={tmp_path}",
        "run.steps=3",
        "eval.num_tasks=4",
        "eval.k=2",
    ]
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "tiny_openenv_grpo"
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 3 and all("reward/mean" in s and s["episode/turns_mean"] >= 1 for s in steps)
    from hetrl.monitor.rollout_store import RolloutReader

    records = RolloutReader(run_dir).records()
    assert len(records) == 3 * 8 * 8
    # Every episode was scored by the game: rewards 0 (or the partial credit of a last miss) up to 1.0 for a hit.
    assert all("env" in r.sample.rewards and 0.0 <= r.sample.rewards["env"] <= 1.0 for r in records)
    assert any(r.sample.rewards["env"] == 1.0 for r in records)
    assert all(r.sample.info["stop_reason"] in ("done", "max_turns", "max_episode_tokens") for r in records)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["samples"]["trained"] == 3 * 8 * 8 and "eval_after_warm_start" in summary
