"""The held-out split in a real run: tiny_grpo with a draw small enough to carve out (8 of its ~120
distinct sums) records the split in summary.json and never trains on a held-out question."""

from __future__ import annotations

import json

import pytest
import yaml

from hetrl.config.loader import validate_tree
from hetrl.env.registry import build_held_out_split
from hetrl.monitor.rollout_store import RolloutReader

pytestmark = [pytest.mark.slow, pytest.mark.mpi, pytest.mark.vllm]


def test_a_run_trains_on_the_training_side_only(tmp_path, launch, warm_started_model):
    launch(
        tmp_path,
        f"model.hf_checkpoint={warm_started_model}",
        "warm_start.steps=1",
        "warm_start.batch_size=16",
        "run.steps=3",
        "run.prompts_per_step=4",
        "eval.num_tasks=8",
        "eval.k=1",
    )
    run_dir = tmp_path / "tiny_grpo"
    cfg = validate_tree(yaml.safe_load((run_dir / "config.yaml").read_text()))
    split = build_held_out_split(cfg.env, seed=cfg.run.seed, num_eval_tasks=cfg.eval.num_tasks)
    recorded = json.loads((run_dir / "summary.json").read_text())["held_out_split"]
    assert recorded == split.report.as_dict() and recorded["num_removed"] > 0 and recorded["overlap_fraction"] == 0.0
    questions = {task.messages[0]["content"] for task, _ in split.held_out}  # "Calculate 3 + 4.": none is in another
    prompts = {record.sample.prompt_text for record in RolloutReader(run_dir).records()}
    assert len(prompts) >= 4 and all("Calculate" in p for p in prompts)
    assert not [q for q in questions for p in prompts if q in p]
