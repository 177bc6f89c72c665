"""A rank frozen mid-run (SIGSTOP) ends the job loudly: checked from outside, as a user would.

For each role, a tiny run is started through ``launch.py``; once step 2 is logged, that role's rank
is stopped with SIGSTOP. The job must exit with the hang code within ``monitor.hang_timeout_s`` +
120 s, name the frozen rank in one message, leave the stacks of the ranks still answering in
``RUN/hang/stacks/``, and leave no process behind.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetrl.control.liveness import HANG_EXIT_CODE

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 45
RUN = [
    "recipe=tiny_grpo",
    "run.steps=12",
    "warm_start.steps=0",
    "run.prompts_per_step=2",
    "algorithm.group_size=4",
    "eval.num_tasks=1",
    "rollout.max_tokens=16",
    "monitor.rollout_store.enabled=false",
    f"monitor.hang_timeout_s={TIMEOUT_S}",
]

pytestmark = [pytest.mark.slow, pytest.mark.mpi, pytest.mark.vllm, pytest.mark.timeout(900)]


def _processes(run_dir: Path) -> dict[int, str]:
    """pid -> HETRL_ROLE of every live process whose command line names the run dir."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(run_dir) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                env = dict(
                    line.split("=", 1)
                    for line in (entry / "environ").read_bytes().decode(errors="replace").split("\0")
                    if "=" in line
                )
                found[int(entry.name)] = env.get("HETRL_ROLE", "")
        except OSError:
            continue  # gone meanwhile
    return found


def _freeze_mid_run(
    tmp_path: Path, role: str, overrides: list[str], wait_s: float, when: tuple[str, str] = ("out.txt", "step 2/")
) -> tuple[int, float, str, int]:
    """Start a run, SIGSTOP ``role``'s rank once ``when`` = (file under tmp_path, text) shows: by default
    once step 2 is on the console; (exit code, seconds to exit, output, pid)."""
    log = open(tmp_path / "out.txt", "w+")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "launch.py"), *RUN, *overrides, f"run.output_dir={tmp_path}"],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    watched, text = tmp_path / when[0], when[1]
    try:
        deadline = time.monotonic() + 600
        while not watched.is_file() or text not in watched.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "out.txt").read_text()[-3000:]
            time.sleep(0.5)
        victim = next(pid for pid, r in _processes(tmp_path / "tiny_grpo").items() if r == role)
        os.kill(victim, signal.SIGSTOP)
        frozen_at = time.monotonic()
        code = proc.wait(timeout=wait_s)
        return code, time.monotonic() - frozen_at, (tmp_path / "out.txt").read_text(errors="replace"), victim
    finally:
        proc.kill()


@pytest.mark.parametrize(
    "role, extra",
    [
        ("rollout", ["rollout.placement=disaggregated"]),
        ("trainer", []),
        ("reward", []),
        ("env", ["env.placement=role", "cluster.env_workers_per_node=1"]),
    ],
)
def test_a_frozen_rank_ends_the_job_and_is_named(tmp_path, role, extra):
    run_dir = tmp_path / "tiny_grpo"
    code, took, out, victim = _freeze_mid_run(tmp_path, role, extra, wait_s=TIMEOUT_S + 120)
    assert code == HANG_EXIT_CODE, out[-3000:]
    assert took <= TIMEOUT_S + 120
    report = (run_dir / "hang" / "report.txt").read_text()
    assert report.strip() in out  # the one message, on the console
    named = report.splitlines()[1]  # the first stuck rank: the frozen one, which stopped answering
    assert f"{role}[0]" in named and f"pid {victim}" in named and "stopped answering" in named, report
    stacks = {p.name for p in (run_dir / "hang" / "stacks").iterdir()}
    assert f"{role}_0.txt" not in stacks and "orchestrator_0.txt" in stacks
    assert _processes(run_dir) == {}


def test_a_weight_push_that_times_out_names_the_engine(tmp_path):
    """Its own bound (rollout.weight_sync_timeout_s), shorter than the hang timeout here: a push to
    a frozen engine is not taken in time (the trainer's socket buffers may well have absorbed a push
    this small), and the orchestrator names that engine.

    The engine is frozen during the warm start, where it is idle between pushes (one per supervised
    step) and every later push is owed by it: frozen mid-RL, it could have taken the step's push and
    be generating, which is the hang watchdog's case above."""
    overrides = [
        "rollout.placement=disaggregated",
        "rollout.weight_sync_timeout_s=15",
        "monitor.hang_timeout_s=300",
        "warm_start.steps=40",
        "warm_start.batch_size=2",
    ]
    code, took, out, _ = _freeze_mid_run(
        tmp_path, "rollout", overrides, wait_s=180, when=("tiny_grpo/logs/rollout_0.log", "now serving weights v3")
    )
    assert code != 0 and took < 120, out[-3000:]
    assert re.search(
        r"weight push v\d+ \(send 1\) (was not taken within rollout.weight_sync_timeout_s=15 s|broke off on the "
        r"trainer: .*)\. "
        r"Engines that did not take it: rollout\[0\] \(world rank 1\)",
        out,
    ), out[-3000:]
    assert _processes(tmp_path / "tiny_grpo") == {}
