"""Math verifications per second with our guards and deadline worker vs bare math-verify in-process.

Contender: ``MathVerifier`` (guards on, each call in a deadline worker process, 2 workers, called
from 2 threads). Baseline: math-verify's parse+verify in the main thread with its own signal
timeout. Same mixed answer set (correct, wrong, hedged, tiny values), interleaved rounds; last
line is the headline.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
# this file's name shadows the math_verify package when run as a script: drop its folder from the path
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from math_verify import parse, verify  # noqa: E402

from hetrl.reward.math import MathVerifier  # noqa: E402

CASES = [
    ("so the answer is \\boxed{42}", "42"),
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{\\frac{1}{2^{98}}}", "\\frac{1}{2^{99}}"),
    ("\\boxed{3} or \\boxed{4}", "4"),
    ("\\boxed{x^2 + 2x + 1}", "(x+1)^2"),
    ("\\boxed{\\sqrt{2}}", "\\frac{2}{\\sqrt{2}}"),
    ("\\boxed{7}", "8"),
    ("\\boxed{12345 6789}", "19134"),
] * 8
ROUNDS = 5


def baseline(completion: str, gold: str) -> bool:
    return verify(parse(f"${gold}$"), parse(completion))


def rate_serial(fn) -> float:
    start = time.perf_counter()
    for c, g in CASES:
        fn(c, g)
    return len(CASES) / (time.perf_counter() - start)


def rate_threads(verifier: MathVerifier) -> float:
    with ThreadPoolExecutor(2) as ex:
        start = time.perf_counter()
        list(ex.map(lambda cg: verifier.verify(*cg), CASES))
        return len(CASES) / (time.perf_counter() - start)


def main() -> None:
    verifier = MathVerifier(timeout_s=10.0, workers=2)
    try:
        verifier.verify("\\boxed{1}", "1")  # start the workers (imports sympy) before timing
        rate_threads(verifier)
        guarded, bare = [], []
        for _ in range(ROUNDS):
            guarded.append(rate_threads(verifier))
            bare.append(rate_serial(baseline))
        accepted = sum(verifier.verify(c, g).correct for c, g in CASES[:8])
        bare_accepted = sum(baseline(c, g) for c, g in CASES[:8])
    finally:
        verifier.close()
    g, b = statistics.median(guarded), statistics.median(bare)
    print(f"guarded (deadline workers, 2 threads): {g:7.1f} verifications/s  (rounds: {', '.join(f'{x:.0f}' for x in guarded)})")
    print(f"bare math-verify (main thread):        {b:7.1f} verifications/s  (rounds: {', '.join(f'{x:.0f}' for x in bare)})")
    print(f"ratio guarded/bare: {g / b:.2f}; accepted of 8 distinct cases: guarded {accepted}, bare {bare_accepted} (bare accepts the false positives)")
    print(f"math_verify: {g:.0f}verifications/s (goal: report; guards on)")


if __name__ == "__main__":
    main()
