"""Algorithms that need the trainer's own models, run end to end through launch.py from the shared
warm-started policy: PPO with its value model (tiny_ppo learns), and a KL folded into the reward (it reaches
the rewards the trainer uses)."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.mpi, pytest.mark.vllm]


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_tiny_ppo_learns(tmp_path, launch, warm_started_model):
    """PPO's critic starts from the policy and learns the returns; the held-out reward rises as tiny_grpo's does
    (measured on the 30 held-out sums, mean@16: 0.254 -> 0.309 in 25 steps; the margin is test_learning's, two
    noise units of that paired mean)."""
    launch(tmp_path, f"model.hf_checkpoint={warm_started_model}", "warm_start.steps=0", recipe="tiny_ppo")
    run_dir = tmp_path / "tiny_ppo"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_after"] >= summary["eval_before"] + 0.04, summary
    rows = _metrics(run_dir)
    assert len(rows) == 25 and all(row["critic/grad_norm"] > 0 and row["loss/value"] > 0 for row in rows)
    early, late = (sum(row["loss/value"] for row in part) / len(part) for part in (rows[:5], rows[-5:]))
    assert late < early, (early, late)  # the critic fits the returns better as it trains
    assert all(abs(row["advantage/mean"]) < 1e-4 for row in rows)  # whitened GAE


@pytest.mark.timeout(1800)  # two runs (and the shared warm start, if no test before built it) on a loaded machine
def test_kl_in_the_reward_reaches_the_rewards(tmp_path, launch, warm_started_model):
    """algorithm.kl_in_reward: the trainer takes kl_coef x KL to its reference from each response's reward,
    checked against the same run without it. The first step's policy is its own reference (no penalty), so
    both runs take the same first step and sample the same second batch: the same verifier rewards, from
    which the trainer's rewards then differ by exactly the penalty it reports, and so does its update."""
    common = (
        f"model.hf_checkpoint={warm_started_model}",
        "warm_start.steps=0",
        "run.steps=3",
        "run.prompts_per_step=4",
        "eval.num_tasks=4",
    )
    launch(tmp_path / "with_kl", *common, "algorithm.kl_in_reward=true", "algorithm.kl_coef=0.01")
    launch(tmp_path / "without", *common)
    with_kl, without = (_metrics(tmp_path / run / "tiny_grpo") for run in ("with_kl", "without"))
    assert len(with_kl) == len(without) == 3
    assert all("loss/kl" not in row for row in with_kl)  # in the reward, not in the loss
    assert all("reward/kl_penalty" not in row for row in without)
    penalty = [row["reward/kl_penalty"] for row in with_kl]
    assert penalty[0] == 0 and all(p > 0 for p in penalty[1:]), penalty
    assert with_kl[1]["reward/mean"] == without[1]["reward/mean"]  # the same second batch
    assert with_kl[1]["reward/shaped_mean"] < without[1]["reward/shaped_mean"]
    assert with_kl[1]["reward/shaped_mean"] == pytest.approx(without[1]["reward/shaped_mean"] - penalty[1], abs=1e-6)
    assert with_kl[0]["grad_norm"] == without[0]["grad_norm"] != 0  # the same first step, bit for bit
    assert with_kl[1]["grad_norm"] != without[1]["grad_norm"]  # the same batch, other rewards: another update
    assert with_kl[-1]["approx_kl"] > 0  # the policy moved away from its reference
