"""Against the real local cluster (slurm/local/cluster.sh): submit, status, logs, cancel, requeue, errors.

The job is hetrl's rendered hetjob (a GPU component with 2 fake GPUs, a CPU component) whose
interpreter is a stand-in worker (slurm_fake_worker.py): the Slurm side is real, the ranks are small.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetrl.config import load_config
from hetrl.control.plan import make_plan
from hetrl.launch import slurm
from hetrl.launch.sbatch import write_sbatch
from tests.launch.local_cluster import NEEDS_LOCAL_CLUSTER

FAKE_WORKER = Path(__file__).with_name("slurm_fake_worker.py")
LOCAL = [
    "cluster.launcher=slurm",
    "cluster.gpus_per_node=2",
    "cluster.cpus_per_node=8",
    "cluster.reward_workers_per_node=2",
    "cluster.time_limit=00:05:00",
    "nodes=1",
]


pytestmark = NEEDS_LOCAL_CLUSTER


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run 'one'"
    path.mkdir()
    return path


def _submit(run_dir: Path, mode: str, monkeypatch: pytest.MonkeyPatch, overrides: tuple[str, ...] = ()) -> str:
    cfg = load_config("tiny_grpo", [*LOCAL, *overrides])
    plan = make_plan(cfg)
    plan.save(run_dir)
    (run_dir / "config.yaml").write_text("recipe: tiny_grpo\n")
    python = run_dir.parent / "fake-python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_WORKER} "$@"\n')
    python.chmod(0o755)
    monkeypatch.setenv("FAKE_WORKER_MODE", mode)  # sbatch exports the submitting environment
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return slurm.submit(plan, cfg.cluster, run_dir, python=str(python))


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_hetjob_runs_one_mpi_world_with_per_component_gpus(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job_id = _submit(run_dir, "probe", monkeypatch)
    assert json.loads((run_dir / "slurm_job.json").read_text())["job_id"] == job_id
    final = slurm.wait(run_dir, timeout_s=60)
    assert final.state == "COMPLETED" and [c.state for c in final.components] == ["COMPLETED", "COMPLETED"]
    plan = json.loads((run_dir / "plan.json").read_text())
    records = [
        json.loads(line.split("FAKE ", 1)[1])
        for path in slurm.log_files(run_dir)
        for line in path.read_text().splitlines()
        if "FAKE " in line
    ]
    world = len(plan["assignments"])
    assert sorted(r["rank"] for r in records) == list(range(world)) and {r["size"] for r in records} == {world}
    by_rank = {r["rank"]: r for r in records}
    for a in plan["assignments"]:
        gpu_component = a["component"] == "train"
        assert by_rank[a["world_rank"]]["cuda"] == ("0,1" if gpu_component else None)
        assert by_rank[a["world_rank"]]["node"].startswith("gpu" if gpu_component else "cpu")
    assert {r["run_dir"] for r in records} == {str(run_dir)}
    text = slurm.logs(run_dir, tail_lines=None)
    assert f"hetrl: job {job_id}" in text and "==> " in text


def test_cancel_mid_run_leaves_no_process(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _submit(run_dir, "sleep", monkeypatch)
    world = len(json.loads((run_dir / "plan.json").read_text())["assignments"])
    pids_dir = run_dir / "pids"
    _wait_for(lambda: pids_dir.is_dir() and len(list(pids_dir.iterdir())) == world, 30, "every rank to start")
    assert slurm.status(run_dir).state == "RUNNING"
    pids = [int(p.read_text()) for p in pids_dir.iterdir()]
    slurm.cancel(run_dir)
    final = slurm.wait(run_dir, timeout_s=30)
    assert final.state.startswith("CANCELLED")
    _wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), 15, "the ranks to be gone")


def test_preemption_signal_checkpoints_requeues_and_resumes(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job_id = _submit(run_dir, "requeue", monkeypatch)
    world = len(json.loads((run_dir / "plan.json").read_text())["assignments"])
    _wait_for(lambda: len(list(run_dir.glob("ready-*"))) == world, 30, "every rank to start")
    # What --signal=B:USR1@grace does near the time limit: signal the batch shell only.
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], check=True)
    _wait_for(lambda: slurm.status(run_dir).restarts >= 1, 30, "the requeue")
    # The restart waits for the old run's credentials to expire (AuthInfo=cred_expire, 10 s here).
    final = slurm.wait(run_dir, timeout_s=90)
    assert final.state == "COMPLETED" and final.restarts == 1
    text = slurm.logs(run_dir, tail_lines=None)
    assert text.count("checkpointed on signal 10") == world
    assert text.count("resumed from checkpoint step-7") == world
    assert "restart 1" in text


def test_bad_partition_is_a_clear_error(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(
        slurm.SlurmSubmitError, match=r"(?s)invalid partition.*nope.*cluster\.gpu_partition.*gpu\*? \(4 nodes"
    ):
        _submit(run_dir, "probe", monkeypatch, ("cluster.gpu_partition=nope",))
    assert not (run_dir / "slurm_job.json").exists()


def test_over_large_request_is_a_clear_error(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 9 nodes feed 18 data-parallel ranks, more than tiny_grpo's 16 groups a step could if shared prompts kept
    # each group on one rank: that refusal is the plan's (tests/control), this one is Slurm's.
    with pytest.raises(
        slurm.SlurmSubmitError, match=r"(?s)Slurm rejected the job: .*(Node count|processors).*lower nodes="
    ):
        _submit(run_dir, "probe", monkeypatch, ("nodes=9", "trainer.shared_prompts=false"))


@pytest.mark.parametrize("nodes", [128, 1024])
def test_scale_renders_pass_sbatch_test_only(nodes: int, tmp_path: Path) -> None:
    """The scale_* partitions are never-booted CLOUD nodes (1024 x 8 GPUs): --test-only validates."""
    cfg = load_config(
        "moe_grpo", [f"nodes={nodes}", "cluster.gpu_partition=scale_gpu", "cluster.cpu_partition=scale_cpu"]
    )
    script = write_sbatch(make_plan(cfg), cfg.cluster, tmp_path)
    done = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0 and f"sgpu[1-{nodes}]" in done.stderr, done.stderr
    too_big = script.read_text().replace(f"--nodes={nodes}\n", f"--nodes={nodes + 1024}\n")
    script.write_text(too_big)
    refused = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert refused.returncode != 0
