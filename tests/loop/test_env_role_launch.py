"""The tool recipe with its environments on env-server ranks (env.placement=role), end to end.

The same shape as the inline run; multi-turn code episodes whose sandboxed tests run on the env
ranks; and an env rank that goes down mid-run without a sample lost or trained twice. A random
policy never calls the calculator, so tool_math episodes take one turn; the code environment's
retry gives every episode a second turn whatever the policy writes.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.mpi, pytest.mark.vllm, pytest.mark.slow]
ROLE = ["recipe=tiny_tool_grpo", "env.placement=role", "cluster.env_workers_per_node=2", "run.steps=2"]


def launch(tmp_path, *overrides, fault=""):
    cmd = [sys.executable, str(ROOT / "launch.py"), *ROLE, f"run.output_dir={tmp_path}", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HETRL_INJECT_FAULT": fault}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "tiny_tool_grpo"
    return run_dir, json.loads((run_dir / "summary.json").read_text())


def served(run_dir, rank):
    return (run_dir / "logs" / f"env_{rank}.log").read_text()


def check_samples(run_dir, steps):
    """What the trainer got: every step, rewards on every sample, sampled and observation ids aligned."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == steps and all("reward/mean" in r and r["episode/turns_mean"] >= 1 for r in rows)
    from hetrl.monitor.rollout_store import RolloutReader

    records = RolloutReader(run_dir).records()
    assert len(records) == steps * 4 * 4
    for r in records:
        s = r.sample
        assert s.rewards and len(s.loss_mask) == len(s.completion_ids) == len(s.logprobs) == len(s.versions)
        assert (0 in s.loss_mask) == (s.num_turns > 1)  # observation ids (mask 0) only between turns
    return records


def test_code_attempts_run_multi_turn_on_env_ranks(tmp_path):
    """Code episodes with a retry: the random policy's code fails in the env rank's sandbox, the
    failure comes back as an observation and the policy takes a second turn, every episode."""
    code = [
        "env.name=code",
        "env.options.max_attempts=2",
        "env.tasks.source=human_eval",
        "env.tasks.options={}",
        "env.max_episode_tokens=4096",
        "model.max_position_embeddings=4096",
    ]
    run_dir, summary = launch(tmp_path, "run.steps=1", *code)
    assert summary["samples"]["trained"] == 4 * 4
    records = check_samples(run_dir, steps=1)
    assert all(r.sample.num_turns == 2 and r.sample.info["stop_reason"] == "done" for r in records)


def test_a_lost_env_rank_costs_no_sample(tmp_path):
    """The tool recipe's shape as in the inline run (tests/loop/test_tool_recipe.py), both env ranks
    serving until env rank 1 goes down on its 20th call: past the first eval (8 one-turn episodes,
    about 12 calls per rank), inside the first training step. One run checks both (a launch costs
    ~40 s of start-up on 2 cores)."""
    run_dir, summary = launch(tmp_path, "run.steps=3", fault="env:1:env_crash@20")
    check_samples(run_dir, steps=3)
    for rank in (0, 1):  # both hosted episodes, and left once the rollout rank did
        assert "all clients left" in served(run_dir, rank) and " of 0 episode(s)" not in served(run_dir, rank)
    samples = summary["samples"]
    assert samples["requeued_generation"] > 0
    assert samples["trained"] == 3 * 4 * 4
    assert samples["issued"] == samples["trained"] + samples["dropped"] + samples["in_flight"]
    assert "injected fault: the env server crashed" in served(run_dir, 1)
    assert "lost its environment" in (run_dir / "logs" / "rollout_0.log").read_text()
    from hetrl.monitor.rollout_store import RolloutReader

    ids = [row.sample_id for row in RolloutReader(run_dir).rows()]
    assert len(ids) == len(set(ids)) == samples["trained"]
