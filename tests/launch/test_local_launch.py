"""Local multi-role launch under one MPMD mpiexec: handshake, crash propagation, clean SIGTERM."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hetrl.control.liveness import HANG_EXIT_CODE

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.mpi


def launch(tmp_path, *overrides, env_extra=None, **popen):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    cmd = [
        sys.executable,
        str(ROOT / "launch.py"),
        "recipe=tiny_grpo",
        f"run.output_dir={tmp_path}",
        "--check",
        *overrides,
    ]
    return subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen
    )


def workers_of(run_dir: Path) -> list[psutil.Process]:
    """Processes whose command line runs a worker of this very run directory (never others')."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "hetrl.launch.worker" in cmdline and str(run_dir) in cmdline:
            found.append(proc)
    return found


def test_handshake_across_all_roles(tmp_path):
    proc = launch(tmp_path, "cluster.reward_workers_per_node=2")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    run_dir = tmp_path / "tiny_grpo"
    record = json.loads((run_dir / "handshake.json").read_text())
    roles = sorted(r["role"] for r in record["ranks"])
    assert roles == ["reward", "reward", "rollout", "trainer"]
    assert all(r["digest"] == record["digest"] for r in record["ranks"])
    assert set(record["heartbeats"].values()) == {2}
    assert len({r["pid"] for r in record["ranks"]} | {record["orchestrator"]["pid"]}) == 5  # one process per rank
    assert (run_dir / "config.yaml").exists() and (run_dir / "plan.json").exists()
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == [
        "orchestrator_0.log",
        "reward_0.log",
        "reward_1.log",
        "rollout_0.log",
        "trainer_0.log",
    ]


def test_crashing_role_brings_the_job_down_with_its_traceback(tmp_path):
    start = time.monotonic()
    proc = launch(tmp_path, env_extra={"HETRL_INJECT_FAULT": "rollout:0:crash"})
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "rollout[0] (world rank 1) crashed" in out and "RuntimeError: injected fault" in out
    assert time.monotonic() - start < 60  # brought down, not left to the handshake timeout
    assert workers_of(tmp_path / "tiny_grpo") == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_every_child(tmp_path, sig):
    run_dir = tmp_path / "tiny_grpo"
    proc = launch(tmp_path, env_extra={"HETRL_INJECT_FAULT": "trainer:0:hang"})
    deadline = time.monotonic() + 60
    while len(workers_of(run_dir)) < 4:
        assert time.monotonic() < deadline, "workers did not start"
        time.sleep(0.2)
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig
    time.sleep(0.5)
    assert workers_of(run_dir) == []


@pytest.mark.slow
def test_a_rank_stuck_in_its_start_is_named_after_the_start_timeout(tmp_path):
    """A rollout rank that never gets to its first beat (injected: it sleeps before its beacon starts).
    The hang timeout passes without a verdict; the start timeout ends the job naming it."""
    start = time.monotonic()
    proc = launch(
        tmp_path,
        "monitor.hang_timeout_s=10",
        "monitor.start_timeout_s=40",
        env_extra={"HETRL_INJECT_FAULT": "rollout:0:hang"},
    )
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == HANG_EXIT_CODE, out
    assert time.monotonic() - start > 40  # not ended at the hang timeout
    report = (tmp_path / "tiny_grpo" / "hang" / "report.txt").read_text()
    assert "rollout[0] (world rank 1): never started within monitor.start_timeout_s=40 s" in report, report
    assert report.strip() in out
    assert workers_of(tmp_path / "tiny_grpo") == []


def test_bad_override_exits_with_message_before_launching(tmp_path):
    proc = launch(tmp_path, "trainer.tensor_paralel=2")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "unknown key 'trainer.tensor_paralel'" in out and "'tensor_parallel'" in out
    assert not (tmp_path / "tiny_grpo").exists()
