"""The second small recipe: multi-turn tool use end to end (tiny_tool_grpo)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.mpi, pytest.mark.vllm]


def test_tiny_tool_grpo_runs_end_to_end(tmp_path):
    cmd = [
        sys.executable,
        str(ROOT / "launch.py"),
        "recipe=tiny_tool_grpo",
        f"run.output_dir={tmp_path}",
        "run.steps=2",
    ]
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "tiny_tool_grpo"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["samples"]["trained"] == 2 * 4 * 4
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 2 and all("episode/turns_mean" in s and s["episode/turns_mean"] >= 1 for s in steps)
    from hetrl.monitor.rollout_store import RolloutReader

    records = RolloutReader(run_dir).records()
    assert records and all(
        r.sample.prompt_ids and len(r.sample.loss_mask) == len(r.sample.completion_ids) for r in records
    )
