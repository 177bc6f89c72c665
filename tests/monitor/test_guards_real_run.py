"""Each guard fires on a real run (through ``launch.py``) rigged to trip it; a ``stop`` guard ends the run.

The entropy-collapse guard has its rig in test_real_run.py. Here one ``warn`` run carries two
injected faults (hetrl.loop.faults) at once, each tripping one guard by really causing what it
watches for, and a second run stops on a NaN loss under the default config:

* ``reward:0:reward_drop@N``: every total reward from step 1's first sample on is lowered by
  ``REWARD_DROP`` (sync schedule: the eval's and step 0's samples are scored before): ``reward_collapse``.
* ``trainer:0:desync_weights@1``: the trainer's weights drift after its first push, so step 1's
  trainer log-probs disagree with the engine's; the next push re-syncs them: ``mismatch_spike`` at
  step 1 only.
* ``trainer:0:nan_loss@1``: NaN advantages in step 0's batch make the real loss NaN:
  ``nonfinite_loss`` (``stop`` by default) ends the run after step 0 is on disk.

Both runs take minutes on 2 cores: the module is slow.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from real_rig import GROUP, PROMPTS, launch, output, read_alerts, read_metrics

from hetrl.loop.faults import REWARD_DROP
from hetrl.monitor import names
from hetrl.monitor.rollout_store import RolloutReader

pytestmark = [pytest.mark.slow, pytest.mark.mpi, pytest.mark.vllm]
EVAL_TASKS = 2
SHORT = ["warm_start.steps=0", f"eval.num_tasks={EVAL_TASKS}"]
MAX_K3_KL = 0.01  # far above fp32 engine/trainer noise, far below what the drifted weights give
RIG = [
    *SHORT,
    "monitor.guards.reward_collapse.window=1",
    f"monitor.guards.reward_collapse.max_drop={REWARD_DROP / 2}",
    f"monitor.guards.mismatch_spike.max_k3_kl={MAX_K3_KL}",
    "monitor.guards.mismatch_spike.spike_factor=null",
]
FIRST_STEP_1_SAMPLE = EVAL_TASKS + PROMPTS * GROUP + 1  # the reward worker's count of scored samples
FAULTS = f"reward:0:reward_drop@{FIRST_STEP_1_SAMPLE},trainer:0:desync_weights@1"


@pytest.fixture(scope="module")
def rigged_run(tmp_path_factory) -> Path:
    run_dir, proc = launch(tmp_path_factory.mktemp("rigged"), RIG, faults=FAULTS)
    assert proc.returncode == 0, output(proc)
    return run_dir


def _fired(run_dir: Path, guard: str) -> list[dict]:
    return [a for a in read_alerts(run_dir) if a["guard"] == guard]


def test_reward_collapse_fires_when_the_reward_drops(rigged_run):
    rows = read_metrics(rigged_run)
    assert rows[0][names.REWARD_MEAN] - rows[1][names.REWARD_MEAN] > REWARD_DROP / 2  # the fault really dropped it
    assert [(a["step"], a["action"]) for a in _fired(rigged_run, "reward_collapse")] == [
        (1, "warn")
    ]  # once per collapse
    assert (rigged_run / "summary.json").exists(), "a warn guard must not end the run"


def test_mismatch_spike_fires_on_the_drifted_step(rigged_run):
    k3 = [row[names.MISMATCH_K3_KL] for row in read_metrics(rigged_run)]
    assert k3[1] > MAX_K3_KL > max(k3[0], k3[2]), k3  # drift at step 1; the next push re-synced the engines
    assert [a["step"] for a in _fired(rigged_run, "mismatch_spike")] == [1]


def test_nan_loss_stops_the_run_with_its_data_on_disk(tmp_path):
    run_dir, proc = launch(tmp_path, SHORT, faults="trainer:0:nan_loss@1")
    assert proc.returncode != 0
    assert "GuardStop" in proc.stdout + proc.stderr and "nonfinite_loss" in proc.stdout + proc.stderr, output(proc)
    assert [(a["guard"], a["action"], a["step"]) for a in read_alerts(run_dir)] == [("nonfinite_loss", "stop", 0)]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0]  # the step that tripped it is on disk, no later one
    assert rows[0][names.LOSS_TOTAL] == "nan" and math.isfinite(rows[0][names.REWARD_MEAN])
    assert len(RolloutReader(run_dir / "rollouts").rows()) == PROMPTS * GROUP  # the step's rollouts were flushed
    assert not (run_dir / "summary.json").exists()
