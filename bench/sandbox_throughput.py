"""Sandboxed executions per second (bwrap + seccomp + rlimits, 2 slots) vs the same program unsandboxed.

Both run the same small Python program (the kind a code reward runs: define a function, call it),
interleaved in rounds in one process so machine load affects both alike. Prints medians over
rounds, the per-execution overhead and the ratio; last line is the headline.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from hetrl.config.reward import SandboxConfig  # noqa: E402
from hetrl.sandbox import SandboxPool, detect_isolation  # noqa: E402

PROGRAM = "def f(n):\n    return sum(i * i for i in range(n))\nprint(f(1000))\n"
WORKERS = 2
PER_ROUND = 40
ROUNDS = 5


def unsandboxed(python: str) -> None:
    subprocess.run([python, "-B", "-s", "-c", PROGRAM], capture_output=True, check=True)


def rate(fn, n: int) -> float:
    with ThreadPoolExecutor(WORKERS) as ex:
        start = time.perf_counter()
        list(ex.map(lambda _: fn(), range(n)))
        return n / (time.perf_counter() - start)


def main() -> None:
    report = detect_isolation()
    print(f"isolation: {report.level} ({report.detail})")
    config = SandboxConfig(workers=WORKERS)
    with SandboxPool(config) as pool:
        check = pool.run(PROGRAM)
        if not check.success:
            raise SystemExit(f"sandbox run failed: {check.reason} {check.stderr[-300:]}")
        boxed, plain = [], []
        for _ in range(ROUNDS):
            boxed.append(rate(lambda: pool.run(PROGRAM), PER_ROUND))
            plain.append(rate(lambda: unsandboxed(config.python), PER_ROUND))
    b, p = statistics.median(boxed), statistics.median(plain)
    overhead_ms = (WORKERS / b - WORKERS / p) * 1000
    print(f"sandboxed:   {b:6.1f} exec/s  (rounds: {', '.join(f'{x:.1f}' for x in boxed)})")
    print(f"unsandboxed: {p:6.1f} exec/s  (rounds: {', '.join(f'{x:.1f}' for x in plain)})")
    print(f"per-execution overhead: {overhead_ms:.1f} ms; sandboxed/unsandboxed throughput: {b / p:.2f}")
    print(f"sandbox_throughput: {b:.1f}exec/s (goal >= 20exec/s)")


if __name__ == "__main__":
    main()
