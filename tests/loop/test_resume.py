"""Checkpoint, pre-emption and resume of the RL loop, end to end through ``launch.py`` (sync schedule).

The runs share one small workload with a dense reward (a length penalty), so every RL step has
non-zero advantages and really changes the weights: identical results then mean something.
Default suite: pre-empt at a step with SIGTERM -> exit code 3 and a checkpoint; relaunching the
same command resumes and finishes, writing and pruning periodic checkpoints. Slow: the resumed run
equals an uninterrupted one bit for bit (weights, optimizer state, metrics), and two
uninterrupted runs equal each other.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
REQUEUE_EXIT_CODE = 3
STEPS = 4
WORKLOAD = [
    "recipe=tiny_grpo",
    f"run.steps={STEPS}",
    "warm_start.steps=2",
    "run.prompts_per_step=4",
    "algorithm.group_size=4",
    "eval.num_tasks=8",
    "reward.functions=[{name: length, kwargs: {target_tokens: 8}}]",
    "checkpoint.every=1",
    "checkpoint.keep=2",
]
pytestmark = [pytest.mark.mpi, pytest.mark.vllm]


def launch(output_dir: Path, *overrides: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "launch.py"), *WORKLOAD, f"run.output_dir={output_dir}", *overrides]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout_s: float = 900) -> str:
    out, _ = proc.communicate(timeout=timeout_s)
    return out


def metric_lines(run_dir: Path) -> list[dict]:
    """metrics.jsonl without wall-clock quantities (times, throughputs), which no two runs share."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    volatile = ("time", "perf/", "throughput/")
    return [{k: v for k, v in row.items() if not k.startswith(volatile)} for row in rows]


def loop_state(checkpoint: Path) -> dict:
    common = torch.load(checkpoint / "common.pt", weights_only=False)
    return common["hetrl"]["extra"]


def latest(run_dir: Path) -> Path:
    root = run_dir / "checkpoints"
    return root / (root / "latest").read_text().strip()


def checkpoint_tensors(checkpoint: Path, scratch: Path) -> dict:
    """Every tensor of a checkpoint (model, optimizer, RNG), read without a process group."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = scratch / f"{checkpoint.parent.parent.parent.name}_{checkpoint.name}.pt"
    dcp_to_torch_save(str(checkpoint), str(target))
    return torch.load(target, weights_only=False)


def assert_same_state(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key


def preempt_after_first_step(output: Path, *overrides: str) -> str:
    """Launch, SIGTERM once the first RL step is logged, and expect the requeue exit; the output."""
    run_dir = output / "tiny_grpo"
    proc = launch(output, *overrides)
    deadline = time.monotonic() + 600
    while len(metric_lines(run_dir)) < 1:
        assert proc.poll() is None, finish(proc)
        assert time.monotonic() < deadline, "no RL step within 600 s"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out = finish(proc)
    assert proc.returncode == REQUEUE_EXIT_CODE, out
    assert "pre-empted (signal 15)" in out, out
    return out


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory) -> Path:
    """A run pre-empted by SIGTERM after its first RL step, then relaunched to the end."""
    output = tmp_path_factory.mktemp("preempted")
    run_dir = output / "tiny_grpo"
    preempt_after_first_step(output)
    stopped_after = len(metric_lines(run_dir))
    state = loop_state(latest(run_dir))
    assert state["loop"]["loop"]["rl_steps_done"] == stopped_after  # checkpointed at the step it stopped at
    assert state["loop"]["loop"]["warm_steps_done"] == 2 and "eval_after_warm_start" in state["loop"]["loop"]["summary"]
    assert not (run_dir / "summary.json").exists()
    run_dir.joinpath("stopped_after").write_text(str(stopped_after))

    proc = launch(output)
    out = finish(proc)
    assert proc.returncode == 0, out
    assert "resumed from" in out, out
    return run_dir


def test_preempted_run_checkpoints_exits_for_requeue_and_resumes_to_the_end(resumed_run):
    rows = metric_lines(resumed_run)
    assert [row["step"] for row in rows] == list(range(STEPS))  # each step once: none redone, none skipped
    summary = json.loads((resumed_run / "summary.json").read_text())
    assert {"eval_before", "eval_after_warm_start", "eval_after"} <= set(summary)
    assert summary["trained_samples"] == 2 * 64 + STEPS * 4 * 4  # warm start + RL, across both processes
    ledger = summary["samples"]  # the RL samples of both processes, not only the resumed one's
    assert ledger["trained"] == STEPS * 4 * 4 and ledger["in_flight"] == 0, ledger
    assert ledger["issued"] == ledger["trained"] + ledger["dropped"], ledger
    # checkpoint.every=1, keep=2: one per step (policy versions 3..6), only the newest two kept.
    kept = sorted(p.name for p in (resumed_run / "checkpoints").iterdir() if p.is_dir())
    assert kept == ["step_00000005", "step_00000006"]
    assert latest(resumed_run).name == "step_00000006"
    assert loop_state(latest(resumed_run))["version"] == 2 + STEPS


@pytest.mark.slow
def test_a_finished_run_relaunched_keeps_the_whole_runs_ledger(tmp_path):
    """The same command again on a finished run resumes it at its end and evaluates again; its summary's
    sample ledger is still the whole run's, not the relaunch's (which issues nothing)."""
    run_dir, overrides = tmp_path / "tiny_grpo", ("run.steps=2", "warm_start.steps=0")
    summaries = []
    for _ in range(2):
        proc = launch(tmp_path, *overrides)
        out = finish(proc)
        assert proc.returncode == 0, out
        summaries.append(json.loads((run_dir / "summary.json").read_text()))
    assert "resumed from" in out, out
    first, again = summaries
    assert first["samples"]["trained"] == 2 * 4 * 4, first["samples"]
    assert again["samples"] == first["samples"]
    assert again["trained_samples"] == first["trained_samples"] == 2 * 4 * 4


@pytest.fixture(scope="module")
def uninterrupted_run(tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("uninterrupted")
    proc = launch(output)
    out = finish(proc)
    assert proc.returncode == 0, out
    return output / "tiny_grpo"


@pytest.mark.slow
def test_resume_is_bit_identical_to_an_uninterrupted_run(resumed_run, uninterrupted_run, tmp_path):
    stopped_after = int((resumed_run / "stopped_after").read_text())
    resumed, reference = metric_lines(resumed_run), metric_lines(uninterrupted_run)
    assert resumed[stopped_after:] == reference[stopped_after:]
    assert resumed == reference
    keys = ("eval_before", "eval_after_warm_start", "eval_after", "trained_samples")
    resumed_summary, reference_summary = (
        json.loads((run / "summary.json").read_text()) for run in (resumed_run, uninterrupted_run)
    )
    assert {k: resumed_summary[k] for k in keys} == {k: reference_summary[k] for k in keys}
    assert_same_state(
        checkpoint_tensors(latest(resumed_run), tmp_path), checkpoint_tensors(latest(uninterrupted_run), tmp_path)
    )


@pytest.mark.slow
def test_same_seed_gives_identical_metrics_and_weights(uninterrupted_run, tmp_path):
    rows = metric_lines(uninterrupted_run)
    assert any(row["grad_norm"] > 0 for row in rows)  # the comparison is not between untrained models
    output = tmp_path / "again"
    proc = launch(output)
    out = finish(proc)
    assert proc.returncode == 0, out
    assert metric_lines(output / "tiny_grpo") == rows
    assert_same_state(
        checkpoint_tensors(latest(output / "tiny_grpo"), tmp_path),
        checkpoint_tensors(latest(uninterrupted_run), tmp_path),
    )


@pytest.mark.slow
def test_async_resume_generates_the_in_flight_groups_again(tmp_path):
    """Under async, groups are in flight at every step boundary: the checkpoint keeps their tasks and
    the resumed run generates and trains them (same group ids), so no task is skipped."""
    from hetrl.monitor.rollout_store import RolloutReader

    schedule = ("schedule.type=async", "schedule.max_staleness=2")
    run_dir = tmp_path / "tiny_grpo"
    preempt_after_first_step(tmp_path, *schedule)
    in_flight = {group_id for group_id, _cursor in loop_state(latest(run_dir))["loop"]["orchestrator"]["in_flight"]}
    assert in_flight, "async keeps groups in flight across a step boundary"
    proc = launch(tmp_path, *schedule)
    out = finish(proc)
    assert proc.returncode == 0 and "resumed from" in out, out
    trained = {row.sample_id.rsplit(".", 1)[0] for row in RolloutReader(run_dir).rows()}
    assert in_flight <= trained, sorted(in_flight - trained)
