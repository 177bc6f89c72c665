"""Served reward models in real runs through launch.py: tiny_judge_grpo and tiny_rm_grpo.

Both start from the shared warm-started tiny_grpo policy; their judge / reward model is that
policy, frozen (``policy``), served by the reward_server role in a process of its own.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tests.conftest import launch_tiny_grpo

pytestmark = [pytest.mark.mpi, pytest.mark.vllm]

SHORT = ["warm_start.steps=0", "eval.num_tasks=8", "eval.k=1"]


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_tiny_judge_grpo_is_rewarded_by_the_served_judge(tmp_path, warm_started_model):
    launch_tiny_grpo(
        tmp_path, f"model.hf_checkpoint={warm_started_model}", *SHORT, "run.steps=3", recipe="tiny_judge_grpo"
    )
    run_dir = tmp_path / "tiny_judge_grpo"
    steps = _metrics(run_dir)
    assert len(steps) == 3
    for step in steps:
        assert (
            0.0 < step["reward/judge/mean"] < 1.0 and step["reward/judge/std"] > 0
        )  # verdicts on the scale, and they differ
        assert step["reward/mean"] == pytest.approx(step["reward/judge/mean"])  # math rides along at weight 0
        assert "reward/math/mean" in step and step["judge/failed_frac"] == 0.0 and step["judge/score_mass"] > 0.0
    log = (run_dir / "logs" / "reward_server_0.log").read_text()
    assert "all reward workers left" in log  # the server served, then left with its clients


@pytest.mark.slow
def test_tiny_rm_grpo_pleases_its_reward_model(tmp_path, warm_started_model):
    launch_tiny_grpo(
        tmp_path, f"model.hf_checkpoint={warm_started_model}", *SHORT, "run.steps=10", recipe="tiny_rm_grpo"
    )
    steps = _metrics(tmp_path / "tiny_rm_grpo")
    rm = [step["reward/reward_model/mean"] for step in steps]
    last = statistics.mean(rm[-3:])
    # Step-to-step noise of the mean is ~0.01 here; a run measured -0.40 at step 1 and -0.34 to -0.35 from step 5 on.
    assert last > rm[0] + 0.03 and last > statistics.mean(rm[:3]), f"reward-model score did not rise: {rm}"
    # A fixed tiny reward model is easy to please: exact answers do not follow it up.
    right = [step["reward/math/mean"] for step in steps]
    assert statistics.mean(right[-3:]) <= statistics.mean(right[:3]) + 0.05, f"math {right}"
    assert any("hack/proxy_corr" in step for step in steps)


@pytest.mark.slow
def test_a_failed_judge_server_is_replaced_by_the_other_replica(tmp_path, warm_started_model, monkeypatch):
    monkeypatch.setenv("HETRL_INJECT_FAULT", "reward_server:0:server_crash@2")
    launch_tiny_grpo(
        tmp_path,
        f"model.hf_checkpoint={warm_started_model}",
        *SHORT,
        "run.steps=3",
        "reward.server.replicas=2",
        recipe="tiny_judge_grpo",
    )
    run_dir = tmp_path / "tiny_judge_grpo"
    steps = _metrics(run_dir)
    assert len(steps) == 3 and all(step["judge/failed_frac"] == 0.0 for step in steps)  # no sample lost its verdict
    assert "injected fault: the reward server crashed" in (run_dir / "logs" / "reward_server_0.log").read_text()
    assert (
        "reward_server rank" in (run_dir / "logs" / "reward_0.log").read_text()
    )  # its requests went to the other replica
