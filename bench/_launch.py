"""Running a command to completion for a benchmark, with a bound, and naming the machine it ran on: shared by
bench/schedules.py and bench/vs_trl.py."""

from __future__ import annotations

import os
import platform
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


def machine() -> str:
    """The CPU (model, family/model numbers, whether it multiplies bf16 natively), core count and load average:
    step times here are comparable only on the same CPU (a move of this VM from a Zen 4 to a Zen 3 EPYC, both
    named "AMD EPYC", slowed every hetrl step ~1.7x with no change of code)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if not line.strip():
                    break  # the first processor's block is enough
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    model = fields.get("model name", platform.processor() or platform.machine())
    numbers = f" (family {fields['cpu family']} model {fields['model']})" if "cpu family" in fields else ""
    bf16 = ", native bf16" if "avx512_bf16" in fields.get("flags", "").split() else ""
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{model}{numbers}{bf16}, {os.cpu_count()} cores, load average {load}"
