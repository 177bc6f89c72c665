"""Shared fixtures: a synthetic run directory written through the real Monitor, and the real runs the
run viewer's browser tests look at (one of each kind per session, each a few steps)."""

from __future__ import annotations

from pathlib import Path

import pytest
from monitor_synth import write_run
from real_rig import output, run_cli

SMALL_EVAL = ["eval.num_tasks=4", "eval.k=1"]


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("run") / "tiny")


def _launch(root: Path, recipe: str, *overrides: str) -> Path:
    proc = run_cli(["launch.py", f"recipe={recipe}", f"run.output_dir={root}", *SMALL_EVAL, *overrides])
    assert proc.returncode == 0, output(proc)
    return root / recipe


@pytest.fixture(scope="session")
def grpo_run(tmp_path_factory, warm_started_model) -> Path:
    """tiny_grpo from the session's warm-started policy: 3 RL steps of 4 prompts x 4 samples."""
    return _launch(
        tmp_path_factory.mktemp("view_grpo"),
        "tiny_grpo",
        f"model.hf_checkpoint={warm_started_model}",
        "warm_start.steps=0",
        "run.steps=3",
        "run.prompts_per_step=4",
        "algorithm.group_size=4",
    )


@pytest.fixture(scope="session")
def vlm_run(tmp_path_factory) -> Path:
    """tiny_vlm_grpo (an image in every prompt), no warm start: 2 steps of 2 prompts x 4 samples."""
    return _launch(
        tmp_path_factory.mktemp("view_vlm"),
        "tiny_vlm_grpo",
        "warm_start.steps=0",
        "run.steps=2",
        "run.prompts_per_step=2",
        "algorithm.group_size=4",
    )
