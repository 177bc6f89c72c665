"""The embedded default learns: held-out reward of tiny_grpo rises well above the initial policy's,
in the sync and in the async schedule (a few minutes each: slow tests)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.mpi, pytest.mark.vllm]


def run_tiny_grpo(tmp_path, *overrides):
    cmd = [sys.executable, str(ROOT / "launch.py"), "recipe=tiny_grpo", f"run.output_dir={tmp_path}", *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[hetrl] held-out mean reward: before" in proc.stdout
    return json.loads((tmp_path / "tiny_grpo" / "summary.json").read_text())


@pytest.mark.parametrize("schedule", [["schedule.type=sync"], ["schedule.type=async", "schedule.max_staleness=2"]], ids=["sync", "async"])
def test_tiny_grpo_improves_held_out_reward(tmp_path, schedule):
    summary = run_tiny_grpo(tmp_path, *schedule)
    assert summary["eval_after"] >= summary["eval_before"] + 0.15, summary
    assert summary["eval_after"] > summary["eval_after_warm_start"], summary  # RL adds on top of the warm start
