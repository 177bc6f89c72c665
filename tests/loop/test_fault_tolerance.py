"""A generation engine, a reward scorer and a weight push that fail mid-run: the run still
finishes, every training sample id is accounted for, none is trained on twice, and the refused
push is sent again."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Two minibatches per step also exercises the PPO-style update path (old log-probs from the step's start).
SMALL = [
    "run.steps=3",
    "warm_start.steps=0",
    "run.prompts_per_step=4",
    "algorithm.group_size=4",
    "eval.num_tasks=4",
    "trainer.updates_per_batch=2",
]

pytestmark = [pytest.mark.mpi, pytest.mark.vllm]


def _run(tmp_path: Path, faults: str, *overrides: str) -> tuple[Path, dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HETRL_INJECT_FAULT": faults}
    cmd = [
        sys.executable,
        str(ROOT / "launch.py"),
        "recipe=tiny_grpo",
        f"run.output_dir={tmp_path}",
        *SMALL,
        *overrides,
    ]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "tiny_grpo"
    return run_dir, json.loads((run_dir / "summary.json").read_text())


def _served_versions(rollout_log: str) -> list[int]:
    return [int(v) for v in re.findall(r"now serving weights v(\d+)", rollout_log)]


def test_engine_and_reward_failures_are_survived(tmp_path):
    run_dir, summary = _run(tmp_path, "rollout:0:engine_crash@3,reward:0:scorer_crash@2,rollout:0:push_refused@1")
    samples = summary["samples"]
    assert samples["requeued_generation"] > 0 and samples["requeued_reward"] > 0
    assert samples["trained"] == 3 * 4 * 4  # steps x prompts x group size, each id once
    assert samples["issued"] == samples["trained"] + samples["dropped"] + samples["in_flight"]
    rollout_log = (run_dir / "logs" / "rollout_0.log").read_text()
    assert "generation engine failed" in rollout_log
    # The first push (v1) was refused and sent again; the engine went on to serve every version.
    assert summary["refused_weight_pushes"] == 1 and "weight push v1 refused" in rollout_log
    assert _served_versions(rollout_log) == [1, 2, 3]
    assert "scoring failed" in (run_dir / "logs" / "reward_0.log").read_text()
    # The trained ids come from the rollout store: no duplicates across steps.
    from hetrl.monitor.rollout_store import RolloutReader

    ids = [row.sample_id for row in RolloutReader(run_dir).rows()]
    assert len(ids) == len(set(ids)) == samples["trained"]


def test_a_push_refused_over_the_filesystem_transport_is_written_again(tmp_path):
    """The filesystem fallback: the engine waits for the trainer to write a version, and a refused one is rewritten."""
    run_dir, summary = _run(
        tmp_path,
        "rollout:0:push_refused@2",
        "run.steps=2",
        "rollout.weight_sync=filesystem",
        "trainer.updates_per_batch=1",
    )
    rollout_log = (run_dir / "logs" / "rollout_0.log").read_text()
    assert summary["refused_weight_pushes"] == 1 and "weight push v2 refused" in rollout_log
    assert _served_versions(rollout_log) == [1, 2]
    assert summary["samples"]["trained"] == 2 * 4 * 4
