"""Fixtures shared by the whole suite: running ``launch.py`` as a user would, and one warm-started
tiny_grpo policy that end-to-end runs start from instead of each paying for its own warm start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT_S = 600

# tiny_grpo's own warm start (32 supervised steps: the policy then answers in <answer></answer>
# tags, so rewards vary within a group). run.steps cannot be 0: the one RL step it must take is
# the smallest there is, at a learning rate that leaves the warm-started weights as they are. The
# recipe's eval.num_tasks stays: the demonstrations come from the training side of its held-out split,
# so a run of seed 0 from this policy evaluates (on that draw or a prefix of it) what it never saw.
WARM_START = [
    "run.name=warm_start",
    "run.steps=1",
    "run.prompts_per_step=1",
    "algorithm.group_size=2",
    "trainer.lr=1e-12",
    "eval.k=1",
    "monitor.rollout_store.enabled=false",
]


def launch_tiny_grpo(
    output_dir: Path, *overrides: str, timeout_s: float = LAUNCH_TIMEOUT_S, recipe: str = "tiny_grpo"
) -> None:
    """Run ``launch.py recipe=tiny_grpo`` (or another tiny recipe) to completion; fail on an error or a hang.

    A run still going after ``timeout_s`` fails the test and leaves no process behind: the
    launcher kills its whole job at its second signal (hetrl.launch.local.run_local); two
    different ones, as two of the same may reach its handler as one.
    """
    cmd = [sys.executable, str(ROOT / "launch.py"), f"recipe={recipe}", f"run.output_dir={output_dir}", *overrides]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate()
        pytest.fail(f"launch.py {' '.join(overrides)} still running after {timeout_s:.0f} s: killed\n{out[-5000:]}")
    assert proc.returncode == 0, out[-5000:]


@pytest.fixture
def launch():
    """:func:`launch_tiny_grpo`, for tests that run tiny_grpo end to end."""
    return launch_tiny_grpo


@pytest.fixture(scope="session")
def warm_started_model(tmp_path_factory) -> Path:
    """An HF checkpoint of tiny_grpo's policy after its warm start; start a run from it with
    ``model.hf_checkpoint=<this> warm_start.steps=0``."""
    root = tmp_path_factory.mktemp("warm_started_model")
    launch_tiny_grpo(root, *WARM_START)
    hf_dir = root / "hf"
    export = subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), "export", str(root / "warm_start"), f"out={hf_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert export.returncode == 0, (export.stdout + export.stderr)[-5000:]
    return hf_dir
