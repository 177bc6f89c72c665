"""A generation engine and a reward scorer that fail mid-run: the run still finishes, every
training sample id is accounted for, and none is trained on twice."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Two minibatches per step also exercises the PPO-style update path (old log-probs from the step's start).
SMALL = ["run.steps=3", "warm_start.steps=0", "run.prompts_per_step=4", "algorithm.group_size=4", "eval.num_tasks=4",
         "trainer.updates_per_batch=2"]

pytestmark = [pytest.mark.mpi, pytest.mark.vllm]


def test_engine_and_reward_failures_are_survived(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "HETRL_INJECT_FAULT": "rollout:0:engine_crash@3,reward:0:scorer_crash@2"}
    cmd = [sys.executable, str(ROOT / "launch.py"), "recipe=tiny_grpo", f"run.output_dir={tmp_path}", *SMALL]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "tiny_grpo"
    summary = json.loads((run_dir / "summary.json").read_text())
    samples = summary["samples"]
    assert samples["requeued_generation"] > 0 and samples["requeued_reward"] > 0
    assert samples["trained"] == 3 * 4 * 4  # steps x prompts x group size, each id once
    assert samples["issued"] == samples["trained"] + samples["dropped"] + samples["in_flight"]
    assert "generation engine failed" in (run_dir / "logs" / "rollout_0.log").read_text()
    assert "scoring failed" in (run_dir / "logs" / "reward_0.log").read_text()
    # The trained ids come from the rollout store: no duplicates across steps.
    from hetrl.monitor.rollout_store import RolloutReader

    ids = [row.sample_id for row in RolloutReader(run_dir).rows()]
    assert len(ids) == len(set(ids)) == samples["trained"]
