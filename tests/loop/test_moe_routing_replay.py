"""Rollout routing replay (R3) in real runs of tiny_moe_grpo: the mismatch it removes, and the layouts it runs under.

The engine samples in bf16 and the trainer computes in fp32, so some tokens are routed to other
experts by the trainer than by the engine. The policy is a random-init 16-expert checkpoint with
strong experts (init_std 0.1), where a token routed elsewhere changes its log-prob a lot: without
replay the engine-vs-trainer k3 is dominated by those tokens, with replay only bf16 rounding is left.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tests.conftest import launch_tiny_grpo

pytestmark = [pytest.mark.mpi, pytest.mark.vllm]

SHORT = ["warm_start.steps=0", "run.steps=3", "eval.num_tasks=4", "eval.k=1"]


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory) -> Path:
    from hetrl.config.loader import load_config
    from hetrl.models.hf import build_random_hf_checkpoint

    cfg = load_config("tiny_moe_grpo")
    return build_random_hf_checkpoint(cfg.model, tmp_path_factory.mktemp("moe16") / "hf", seed=0, init_std=0.1)


def _run(tmp_path: Path, checkpoint: Path, *overrides: str) -> list[dict]:
    launch_tiny_grpo(tmp_path, f"model.hf_checkpoint={checkpoint}", *SHORT, *overrides, recipe="tiny_moe_grpo")
    return [json.loads(line) for line in (tmp_path / "tiny_moe_grpo" / "metrics.jsonl").read_text().splitlines()]


def test_routing_replay_removes_the_routing_mismatch(tmp_path, moe_checkpoint):
    measured = _run(tmp_path / "off", moe_checkpoint, "rollout.routing_replay=false", "rollout.return_routing=true")
    replayed = _run(tmp_path / "on", moe_checkpoint)
    assert len(measured) == len(replayed) == 3
    # The engine routes some tokens elsewhere than the trainer would, with or without replay.
    assert all(step["routing/disagree_frac"] > 1e-3 for step in measured + replayed)
    k3_off = statistics.median(step["mismatch/k3_kl"] for step in measured)
    k3_on = statistics.median(step["mismatch/k3_kl"] for step in replayed)
    assert k3_off / k3_on >= 10, f"k3 without replay {k3_off:.3g}, with {k3_on:.3g}"
    assert max(s["mismatch/max_abs_logprob_diff"] for s in replayed) < min(
        s["mismatch/max_abs_logprob_diff"] for s in measured
    )

    from hetrl.monitor.rollout_store import RolloutReader

    records = RolloutReader(tmp_path / "on" / "tiny_moe_grpo").records()
    assert records
    for record in records:  # the store keeps each sample's routing: [prompt + completion - 1, layers, top_k]
        s = record.sample
        assert s.routed_experts.shape == (len(s.prompt_ids) + len(s.completion_ids) - 1, 2, 2)
        assert s.routed_experts.max() < 16


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout",
    [
        "trainer.pipeline_parallel=2",
        "trainer.expert_parallel=2",
        "trainer.tensor_parallel=2 trainer.sequence_parallel=true",
    ],
)
def test_routing_replay_under_trainer_layouts(tmp_path, moe_checkpoint, layout):
    """Each pipeline stage replays its own layers; each expert-parallel rank routes its own samples' tokens; under
    TP with sequence parallelism (which megatron's MoE layers need) each TP rank routes its share of the sequence."""
    replayed = _run(tmp_path, moe_checkpoint, *layout.split())
    assert len(replayed) == 3
    # The replayed level of a one-rank trainer (~2e-4 on this checkpoint); a misplaced row would be ~5e-3.
    assert statistics.median(step["mismatch/k3_kl"] for step in replayed) < 1e-3


def test_the_shipped_recipe_runs(tmp_path):
    """tiny_moe_grpo as shipped (warm start, then GRPO with replay) completes, reporting the routing disagreement."""
    launch_tiny_grpo(tmp_path, "run.steps=3", recipe="tiny_moe_grpo")
    summary = json.loads((tmp_path / "tiny_moe_grpo" / "summary.json").read_text())
    steps = [json.loads(line) for line in (tmp_path / "tiny_moe_grpo" / "metrics.jsonl").read_text().splitlines()]
    assert all("routing/disagree_frac" in step for step in steps)
    assert summary["samples"]["trained"] == 3 * 16 * 8
