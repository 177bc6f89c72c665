"""A rank's output: library chatter into its log at the descriptor level, hetrl's own lines on the console.

Each case runs in a child process (it rewires descriptors 1 and 2) whose stdout and stderr are
pipes read here, standing in for mpiexec's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hetrl.config.loader import load_config
from hetrl.control.plan import make_plan
from hetrl.launch.local import mpiexec_command
from hetrl.launch.worker import TERMINAL_ENV

ROOT = Path(__file__).resolve().parents[2]

CHATTER = r"""
import ctypes, os, subprocess, sys, warnings
from pathlib import Path
from hetrl.launch.worker import keep_stdout, send_output_to
if sys.argv[2] == "orchestrator":
    keep_stdout(terminal=sys.argv[3] == "terminal")
console = send_output_to(Path(sys.argv[1]))
os.write(1, b"fd 1 chatter\n")
os.write(2, b"fd 2 chatter\n")
ctypes.CDLL(None).dprintf(2, b"C++ chatter\n")
warnings.warn("library warning")
subprocess.run([sys.executable, "-c", "print('child chatter')"], check=True)
print("sys.stdout line", "tty" if sys.stdout.isatty() else "pipe", flush=True)
console.write("[hetrl] console line\n")
"""

CRASH = r"""
import logging, os, sys
from pathlib import Path
from hetrl.launch import worker
class World:
    def Abort(self, code):
        logging.shutdown()
        os._exit(7)
log = Path(sys.argv[1])
worker._abort_on_exception(World(), "rollout[0] (world rank 1)", worker.send_output_to(log))
logging.basicConfig(filename=log, level=logging.INFO)
raise RuntimeError("boom")
"""


def _child(script: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60, env=env)


def test_a_rank_writes_its_libraries_output_to_its_log_and_hetrl_lines_to_the_console(tmp_path):
    log = tmp_path / "rollout_0.log"
    proc = _child(CHATTER, str(log), "rollout", "-")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr == "[hetrl] console line\n"
    logged = log.read_text()
    for line in (
        "fd 1 chatter",
        "fd 2 chatter",
        "C++ chatter",
        "UserWarning: library warning",
        "child chatter",
        "sys.stdout line pipe",
    ):
        assert line in logged, line


def test_the_orchestrator_keeps_stdout_for_its_lines_and_a_terminal_says_so(tmp_path):
    for terminal, seen_as in (("-", "pipe"), ("terminal", "tty")):
        log = tmp_path / f"orchestrator_{terminal}.log"
        proc = _child(CHATTER, str(log), "orchestrator", terminal)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == f"sys.stdout line {seen_as}\n"
        assert proc.stderr == "[hetrl] console line\n"
        assert "fd 1 chatter" in log.read_text() and "UserWarning: library warning" in log.read_text()


def test_a_crash_report_reaches_the_console_and_the_log(tmp_path):
    log = tmp_path / "rollout_0.log"
    proc = _child(CRASH, str(log))
    assert proc.returncode == 7
    assert (
        proc.stderr.startswith("\n[hetrl] rollout[0] (world rank 1) crashed:\nTraceback")
        and "RuntimeError: boom" in proc.stderr
    )
    assert "CRITICAL:root:crashed" in log.read_text() and "RuntimeError: boom" in log.read_text()


def test_only_the_orchestrator_is_told_of_the_launchers_terminal(tmp_path):
    cfg = load_config("tiny_grpo", [])
    plan = make_plan(cfg)
    plain = mpiexec_command(cfg, plan, tmp_path)
    assert TERMINAL_ENV not in plain and "COLUMNS" not in plain
    command = mpiexec_command(cfg, plan, tmp_path, terminal=os.terminal_size((123, 45)))
    segments = " ".join(command).split(" : ")
    told = [s for s in segments if TERMINAL_ENV in s]
    assert len(told) == 1 and "HETRL_ROLE orchestrator" in told[0]
    assert f"-env {TERMINAL_ENV} 1 -env COLUMNS 123 -env LINES 45" in told[0]
