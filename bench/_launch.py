"""Running a command to completion for a benchmark, with a bound: shared by bench/schedules.py and bench/vs_trl.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(cmd: list[str], what: str, timeout_s: float, env: dict[str, str] | None = None) -> str:
    """Run ``cmd`` from the repository root; its output, or exit naming ``what`` with the output's tail."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})}
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the launcher kills its whole job on a second signal
        proc.send_signal(signal.SIGTERM)
        proc.communicate()
        raise SystemExit(f"{what} did not finish within {timeout_s:g} s") from None
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{output[-4000:]}")
    return output


def launch(*words: str, what: str, timeout_s: float) -> str:
    """``launch.py WORDS`` as a user runs it (the launcher gives each role its own thread count)."""
    return run([sys.executable, str(ROOT / "launch.py"), *words], what, timeout_s, env={"OMP_NUM_THREADS": "1"})
