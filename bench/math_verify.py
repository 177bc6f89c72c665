"""Math verifications per second and agreement: hetrl's guarded ``MathVerifier`` vs math-verify called directly.

The answers: tests/reward/data/math_corpus.jsonl (made by math_corpus.py beside it, issue 37): gold answers from
reasoning-gym's math tasks and math-verify's few-shot answers, paired with predictions in the forms models write
(LaTeX and plain, units, thousands and decimal commas, rounded decimals, intervals and inequalities, matrices,
equations rescaled or solved, renamed function variables, worked answers), each with the verdict its
generator decided. The corpus, shuffled, is cut into rounds: every answer is verified once by each contender, so
no verdict is cached from an earlier round.

Contender: ``MathVerifier`` (guards on, 1 deadline worker, its verdict cache), called from one thread.
Baseline: ``verify(parse(gold), parse(completion))`` in the main thread with math-verify's own signal timeouts.
Both contenders on the same round, their order alternating; the headline is the ratio of the median
throughputs. Agreement: each contender's verdicts against the expected ones, per category, and hetrl's against
math-verify's. Printed beside it: the throughput on the answers only sympy can judge (hetrl's worker path), where
the contender pays for its deadline process.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
# this file's name shadows the math_verify package when run as a script: drop its folder from the path
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from math_verify import parse, verify  # noqa: E402

from hetrl.reward.math_answers import TIMEOUT, MathVerifier, find_answer, quick_verdict  # noqa: E402

ROUNDS = 7
CORPUS = os.path.join(HERE, "..", "tests", "reward", "data", "math_corpus.jsonl")


def load_rounds() -> list[list[dict]]:
    """The corpus, shuffled (seeded), cut into ``ROUNDS`` rounds of different answers."""
    with open(CORPUS) as f:
        items = [json.loads(line) for line in f]
    random.Random(0).shuffle(items)
    return [items[i::ROUNDS] for i in range(ROUNDS)]


def bare(completion_text: str, gold: str) -> bool:
    return verify(parse(f"${gold}$"), parse(completion_text))


TIMEOUTS = Counter()  # hetrl's verdicts lost to its deadline (math/timeout): a loaded machine's, not the answer's


def timed(fn, items: list[dict]) -> tuple[list[float], list]:
    """(seconds per call, verdicts as booleans), calls in corpus order."""
    seconds, verdicts = [], []
    for item in items:
        start = time.perf_counter()
        verdict = fn(item["prediction"], item["gold"])
        seconds.append(time.perf_counter() - start)
        if not isinstance(verdict, bool):
            TIMEOUTS[item["category"]] += TIMEOUT in verdict.flags
            verdict = verdict.correct
        verdicts.append(verdict)
    return seconds, verdicts


def race(verifier: MathVerifier, rounds: list[list[dict]]) -> tuple[list, list]:
    """Both contenders on each round, their order alternating: per round, each one's (seconds, verdicts)."""
    ours, theirs = [], []
    for i, items in enumerate(rounds):
        contenders = [("hetrl", verifier.verify), ("bare", bare)]
        results = {name: timed(fn, items) for name, fn in (contenders if i % 2 == 0 else contenders[::-1])}
        ours.append(results["hetrl"])
        theirs.append(results["bare"])
    return ours, theirs


def rate(runs: list, rounds: list[list[dict]], keep=lambda item: True) -> list[float]:
    """Verifications per second of each round, over the items ``keep`` selects."""
    out = []
    for (seconds, _), items in zip(runs, rounds):
        kept = [s for s, item in zip(seconds, items) if keep(item)]
        out.append(len(kept) / sum(kept))
    return out


def agreement(runs: list, rounds: list[list[dict]]) -> Counter:
    """Per category (and "all"): verdicts equal to the expected ones."""
    out = Counter()
    for (_, verdicts), items in zip(runs, rounds):
        for verdict, item in zip(verdicts, items):
            hit = verdict == item["expected"]
            out[item["category"]] += hit
            out["all"] += hit
    return out


def warm_up(verifier: MathVerifier) -> None:
    """Worker start-up and first parses, untimed, on answers the corpus does not hold."""
    for prediction, gold in [(r"\boxed{x^2 + 2}", "x^2+1"), (r"\boxed{\frac{1}{7}}", "0.142857"), ("So 3.", "[1, 2]")]:
        verifier.verify(prediction, gold)
        bare(prediction, gold)


def main() -> None:
    rounds = load_rounds()
    items = [item for r in rounds for item in r]
    in_process = {item["id"] for item in items if quick_verdict(find_answer(item["prediction"]), item["gold"])}
    verifier = MathVerifier(timeout_s=5.0, workers=1)
    try:
        warm_up(verifier)
        ours, theirs = race(verifier, rounds)
    finally:
        verifier.close()
    total = len(items)
    print(f"{total} corpus answers in {ROUNDS} rounds; {len(in_process) / total:.0%} decided in process")
    mine, bases = agreement(ours, rounds), agreement(theirs, rounds)
    counts = Counter(item["category"] for item in items)
    print("agreement with the expected verdicts, per category (hetrl / math-verify / answers):")
    for category in sorted(counts):
        print(f"  {category:20s} {mine[category]:4d} / {bases[category]:4d} / {counts[category]}")
    same = sum(a == b for (_, x), (_, y) in zip(ours, theirs) for a, b in zip(x, y))
    print(
        f"agreement: hetrl {mine['all']}/{total}, math-verify {bases['all']}/{total}; hetrl with math-verify "
        f"{same}/{total}; hetrl verdicts lost to its 5 s deadline: {sum(TIMEOUTS.values())} {dict(+TIMEOUTS)}"
    )
    fast, slow = rate(ours, rounds), rate(theirs, rounds)
    print(f"hetrl MathVerifier (guards, 1 worker): {statistics.median(fast):7.1f} verifications/s")
    print(f"math-verify parse+verify (direct):     {statistics.median(slow):7.1f} verifications/s")

    def hard(item: dict) -> bool:
        return item["id"] not in in_process

    hard_ratio = statistics.median(rate(ours, rounds, hard)) / statistics.median(rate(theirs, rounds, hard))
    print(f"answers needing sympy only ({total - len(in_process)}): hetrl / math-verify {hard_ratio:.2f}x")
    print(f"math_verify: {statistics.median(fast) / statistics.median(slow):.2f}x (goal >= 1.0x)")


if __name__ == "__main__":
    main()
