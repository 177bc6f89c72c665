"""The console of ``launch.py`` as a user sees it: quiet by default, the live view on a terminal.

Two short runs from the session's warm-started policy: one with its output in a pipe (hetrl's
lines only; the libraries' output is in the role logs), one on a pseudo-terminal with
``monitor.verbose=true`` (the live view, and the libraries' output on the console too).
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.mpi, pytest.mark.vllm]

SHORT = [
    "warm_start.steps=0",
    "run.steps=3",
    "run.prompts_per_step=4",
    "algorithm.group_size=4",
    "eval.num_tasks=2",
    "eval.k=1",
    "checkpoint.every=0",
    "monitor.rollout_store.enabled=false",
]
TIMEOUT_S = 300
VLLM_INFO = "INFO"  # vLLM's lines read "(MainProcess pid=N) INFO 12-04 08:54:03 [model.py:733] ..."
SUMMARY = "[hetrl] held-out mean reward"
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # rich's cursor moves, erasures, colours


def _command(tmp_path: Path, model: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "launch.py"),
        "recipe=tiny_grpo",
        f"run.output_dir={tmp_path}",
        f"model.hf_checkpoint={model}",
        *SHORT,
        *overrides,
    ]


def _on_a_terminal(command: list[str], columns: int, lines: int) -> tuple[int, str]:
    """Run ``command`` with stdout and stderr on a fresh pseudo-terminal of that size; (exit code, output)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    os.close(slave)
    chunks, deadline = [], time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 1.0)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not chunk:
                    break
                chunks.append(chunk)
        else:
            proc.terminate()
    finally:
        os.close(master)
    return proc.wait(timeout=60), b"".join(chunks).decode(errors="replace")


def test_the_console_shows_hetrl_lines_only_and_the_logs_the_rest(tmp_path, warm_started_model):
    proc = subprocess.run(
        _command(tmp_path, warm_started_model),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console[-5000:]
    lines = console.splitlines()
    assert len(lines) < 60, console
    assert [line for line in lines if VLLM_INFO in line] == []
    assert "step 3/3 | " in proc.stdout and SUMMARY in proc.stdout
    logs = {path.name: path.read_text() for path in (tmp_path / "tiny_grpo" / "logs").iterdir()}
    assert "Resolved architecture: LlamaForCausalLM" in logs["rollout_0.log"]  # vLLM's logger
    assert "UserWarning" in logs["trainer_0.log"]  # megatron's warnings
    assert not any("RotaryEmbedding: Failed to load weights" in text for text in logs.values())


def test_verbose_on_a_terminal_shows_the_live_view_and_the_libraries_output(tmp_path, warm_started_model):
    code, console = _on_a_terminal(
        _command(tmp_path, warm_started_model, "monitor.verbose=true"), columns=200, lines=40
    )
    assert code == 0, console[-5000:]
    assert "\x1b[" in console and "RL steps" in console and "eta" in console and "3/3" in console  # rich's live view
    assert "step 1/3 | " not in console  # not the plain lines
    assert f"{VLLM_INFO} " in console and "Resolved architecture" in console
    # Printed above the view while it is up (rich erases the view, prints, redraws): a line of its own on screen.
    assert any(line.startswith(SUMMARY) for line in re.split(r"[\r\n]+", ESCAPE.sub("", console)))
