"""tiny_grpo as a real heterogeneous job on the local cluster (slurm/local/cluster.sh), real worker.

Everything goes through ``launch.py`` as a user types it: ``recipe=tiny_grpo cluster=local_slurm``
submits trainer + engines to the ``gpu`` partition (2 fake GPUs: the ranks run their CPU paths) and
the orchestrator + reward worker to ``cpu``; ``status``, ``logs`` and ``cancel`` read the run dir.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hetrl.config import load_config
from hetrl.launch import slurm
from tests.launch.local_cluster import NEEDS_LOCAL_CLUSTER
from tests.loop.test_learning import assert_tiny_grpo_learned

REPO = Path(__file__).resolve().parents[2]
SHORT = ("run.steps=3", "warm_start.steps=3", "run.prompts_per_step=4", "algorithm.group_size=4", "eval.num_tasks=8")
ROLE_LOGS = ("trainer_0", "trainer_1", "rollout_0", "rollout_1", "reward_0", "orchestrator_0")

# A short run takes ~3 min on a quiet 2-core machine and 10+ min when it is busy: slow, long timeout.
pytestmark = [*NEEDS_LOCAL_CLUSTER, pytest.mark.slow, pytest.mark.timeout(1800)]
JOB_TIMEOUT_S = 1500


def launch(*words: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "launch.py", *words], cwd=REPO, capture_output=True, text=True, timeout=timeout_s, env=env
    )


def submit(root: Path, name: str, *overrides: str) -> Path:
    done = launch(
        "recipe=tiny_grpo",
        "cluster=local_slurm",
        "trainer.precision=fp32",
        f"run.output_dir={root}",
        f"run.name={name}",
        *overrides,
    )
    assert done.returncode == 0 and "submitted job" in done.stdout, done.stdout + done.stderr
    return root / name


def processes_of(run_dir: Path) -> dict[int, str]:
    """pid -> command line of every live process whose command line names the run dir (srun, ranks)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # exited while we looked
        if str(run_dir) in cmdline:
            found[int(entry.name)] = cmdline
    return found


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f}s waiting for {what}"
        time.sleep(0.5)


def wait_for_log_line(run_dir: Path, log: str, line: str, what: str) -> None:
    """Wait until ``logs/<log>.log`` of the job holds ``line``; fail at once, with the job's state and
    logs, when the job ends first, and with the queue and the nodes too when it times out (the job is
    cancelled either way, so that it holds no node the next test needs)."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    next_status = 0.0
    while line not in _text(run_dir / "logs" / f"{log}.log"):
        if time.monotonic() < next_status:
            time.sleep(0.5)
            continue
        next_status = time.monotonic() + 5  # squeue and sacct are processes: not every half second
        state = slurm.status(run_dir)
        ended = state.done and line not in _text(run_dir / "logs" / f"{log}.log")  # it may have come meanwhile
        if ended or time.monotonic() > deadline:
            queue = subprocess.run(
                ["squeue", "-o", "%i %P %j %T %M %R"], capture_output=True, text=True, timeout=30
            ).stdout
            nodes = subprocess.run(
                ["sinfo", "-N", "-o", "%N %P %T %E"], capture_output=True, text=True, timeout=30
            ).stdout
            launch("cancel", str(run_dir))
            why = "the job ended" if ended else f"timed out after {JOB_TIMEOUT_S}s"
            pytest.fail(
                f"{why} waiting for {what} ({line!r} in logs/{log}.log)\n{state}\nsqueue:\n{queue}\nsinfo:\n{nodes}\n"
                f"{slurm.logs(run_dir)}"
            )


@pytest.fixture(scope="module")
def runs_root() -> Iterator[Path]:
    """Run dirs outside pytest's tmp_path: other sessions' pytest runs prune old basetemps (keeping
    three), which would delete a job's run dir under it while the job still runs."""
    root = Path(tempfile.mkdtemp(prefix="hetrl-slurm-e2e-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def finished_run(runs_root: Path) -> tuple[Path, float]:
    """The whole embedded default as a hetjob (2 trainer ranks, 2 engines, reward worker on cpu), run to
    completion once and shared by the checks below (a job costs minutes): (run dir, seconds)."""
    started = time.monotonic()
    run_dir = submit(runs_root, "full")
    slurm.wait(run_dir, timeout_s=JOB_TIMEOUT_S, poll_s=2)
    return run_dir, time.monotonic() - started


def test_tiny_grpo_hetjob_completes_and_runs_the_loop(finished_run: tuple[Path, float]) -> None:
    run_dir, seconds = finished_run
    final = slurm.status(run_dir)
    assert final.state == "COMPLETED" and [c.state for c in final.components] == ["COMPLETED", "COMPLETED"], slurm.logs(
        run_dir
    )
    assert final.components[0].nodes.startswith("gpu") and final.components[1].nodes.startswith("cpu")
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("eval_before", "eval_after_warm_start", "eval_after"):
        assert isinstance(summary[key], float) and math.isfinite(summary[key]), summary
    # The warm start's demonstrations, then RL samples on top (at most steps x prompts x group size).
    cfg = load_config("tiny_grpo")
    warm = cfg.warm_start.steps * cfg.warm_start.batch_size
    rl = cfg.run.steps * cfg.run.prompts_per_step * cfg.algorithm.group_size
    assert warm < summary["trained_samples"] <= warm + rl
    print(f"tiny_grpo hetjob run: {seconds:.0f}s submit-to-done; summary {summary}")


def test_status_and_logs_report_the_run(finished_run: tuple[Path, float]) -> None:
    run_dir, _ = finished_run
    job_id = slurm.job_id_of(run_dir)
    status = launch("status", str(run_dir))
    assert status.returncode == 0, status.stderr
    assert re.search(
        rf"job {job_id}: COMPLETED\n  component 0: COMPLETED on gpu\d.*\n  component 1: COMPLETED on cpu\d",
        status.stdout,
    ), status.stdout
    logs = launch("logs", str(run_dir))
    assert logs.returncode == 0, logs.stderr
    for name in ROLE_LOGS:  # every rank's own log, and what it wrote there
        assert f"==> {run_dir}/logs/{name}.log <==" in logs.stdout
        role, index = name.rsplit("_", 1)
        assert f"{role}[{index}] INFO role finished" in logs.stdout, f"{name} did not finish cleanly"
    # vLLM's chatter is in the engine's own log (quiet console; `logs` shows each log's last 100 lines, after
    # the engine's start in a whole run); each component's stdout/stderr (srun --label) is shown too: the
    # loop's result on cpu.
    assert "init engine" in (run_dir / "logs" / "rollout_0.log").read_text()
    assert re.search(r"==> .*/logs/train-node0\.log <==", logs.stdout)
    assert re.search(
        r"==> .*/logs/cpu-node0\.log <==(.|\n)*\d: \[hetrl\] held-out mean reward \(.*\): before", logs.stdout
    )
    assert f"hetrl: job {job_id} (restart 0)" in logs.stdout


def test_tiny_grpo_hetjob_learns(finished_run: tuple[Path, float]) -> None:
    """The hetjob learns by the same margins as the local run."""
    run_dir, _ = finished_run
    summary = json.loads((run_dir / "summary.json").read_text())
    print(
        f"tiny_grpo hetjob: held-out {summary['eval_before']:.3f} -> {summary['eval_after_warm_start']:.3f} (warm "
        f"start) "
        f"-> {summary['eval_after']:.3f} (RL)"
    )
    assert_tiny_grpo_learned(summary)


def test_cancel_mid_run_leaves_no_process(runs_root: Path) -> None:
    run_dir = submit(runs_root, "cancelled", "run.steps=50")
    wait_for_log_line(run_dir, "trainer_1", "handshake done", "the ranks to join the control plane")
    wait_for_log_line(run_dir, "rollout_1", "init engine", "the engines to start")
    assert slurm.status(run_dir).state == "RUNNING"
    ranks = processes_of(run_dir)
    assert sum("hetrl.launch.worker" in c for c in ranks.values()) >= 6, ranks
    done = launch("cancel", str(run_dir))
    assert done.returncode == 0 and slurm.job_id_of(run_dir) in done.stdout, done.stderr
    final = slurm.wait(run_dir, timeout_s=60)
    assert final.state.startswith("CANCELLED")
    wait_for(lambda: not processes_of(run_dir), 30, f"every process of the run to exit (left: {processes_of(run_dir)})")
    assert not (run_dir / "summary.json").exists()


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def test_preempted_job_checkpoints_requeues_and_resumes(runs_root: Path) -> None:
    """SIGUSR1 to the batch shell (what --signal=B:USR1@grace does before the time limit): the ranks
    checkpoint at the next step boundary and exit 3, the script requeues, the job resumes and ends."""
    run_dir = submit(runs_root, "requeued", *SHORT[1:], "run.steps=6")
    job_id = slurm.job_id_of(run_dir)
    # Weights v4 = the 3 warm-start steps and one RL step: the loop is mid-RL.
    wait_for_log_line(run_dir, "rollout_0", "serving weights v4", "the first RL step")
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], check=True)
    wait_for(lambda: slurm.status(run_dir).restarts >= 1, JOB_TIMEOUT_S, "the requeue")
    final = slurm.wait(run_dir, timeout_s=JOB_TIMEOUT_S, poll_s=2)
    text = slurm.logs(run_dir, tail_lines=None)
    assert final.state == "COMPLETED" and final.restarts == 1, text
    preempted = re.search(r"\[hetrl\] pre-empted \(signal 10\) after (\d+) RL steps", text)
    resumed = re.search(r"\[hetrl\] resumed from \S+: policy v\d+, 3 warm-start and (\d+) RL steps done", text)
    assert preempted and resumed, text
    assert 1 <= int(preempted.group(1)) < 6 and resumed.group(1) == preempted.group(1)
    assert f"hetrl: ranks checkpointed; requeueing job {job_id}" in text and f"hetrl: job {job_id} (restart 1)" in text
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trained_samples"] > 3 * 64


def test_hung_job_is_killed_named_requeued_and_resumes(runs_root: Path) -> None:
    """A reward rank frozen (SIGSTOP) mid-RL: the watchdog beside srun names it, saves the other
    ranks' stacks, kills the step, and the script requeues the job, which resumes from its last
    checkpoint and completes."""
    run_dir = submit(
        runs_root,
        "hung",
        *SHORT[1:],
        "run.steps=12",
        "checkpoint.every=1",
        "monitor.hang_timeout_s=45",
        "monitor.hang_restarts=1",
    )
    job_id = slurm.job_id_of(run_dir)
    deadline = time.monotonic() + JOB_TIMEOUT_S  # freeze at once: the 12 RL steps take ~30 s
    while "serving weights v4" not in _text(run_dir / "logs" / "rollout_0.log"):
        assert time.monotonic() < deadline, "timed out waiting for the first RL step"
        time.sleep(0.1)
    reward = json.loads((run_dir / "hang" / "beats" / "rank_4.json").read_text())
    assert reward["role"] == "reward", reward
    os.kill(reward["pid"], signal.SIGSTOP)
    wait_for(lambda: slurm.status(run_dir).restarts >= 1, 45 + 180, "the watchdog's requeue")
    assert not Path(f"/proc/{reward['pid']}").exists(), "the frozen rank outlived its step"
    final = slurm.wait(run_dir, timeout_s=JOB_TIMEOUT_S, poll_s=2)
    text = slurm.logs(run_dir, tail_lines=None)
    assert final.state == "COMPLETED" and final.restarts == 1, text
    report = (run_dir / "hang" / "report.txt").read_text()
    assert f"reward[0] (world rank 4, pid {reward['pid']}" in report and "stopped answering" in report, report
    assert "[hetrl] HANG" in text and f"the job hung (see {run_dir}/hang/report.txt); requeueing job {job_id}" in text
    assert (run_dir / "hang" / "stacks" / "orchestrator_0.txt").exists()
    assert re.search(r"\[hetrl\] resumed from \S+: policy v\d+, 3 warm-start and \d+ RL steps done", text), text
    assert (run_dir / "hang" / "restarts").read_text().startswith("1 step_")  # one hang, after that checkpoint
