"""Math verifications per second: hetrl's guarded ``MathVerifier`` vs math-verify called directly, same answers.

A realistic mix, as a GRPO math run scores it: prompts in groups of 4 samples, each sample a long chain of
thought (1.5-4k characters of reasoning with numbers and inline math) that ends in one final answer, boxed
(85%) or stated in words ("The final answer is $X$.", "... we obtain $X$, as claimed."). Answers are
integers, fractions and decimals, numbers with units, matrices (some written as a scalar times a matrix),
sets, intervals, tuples and equations; about 60% right, in varied but equivalent forms, the rest wrong.

Contender: ``MathVerifier`` (guards on, 1 deadline worker, its verdict cache), called from one thread.
Baseline: ``verify(parse(gold), parse(completion))`` in the main thread with math-verify's own signal timeouts.
Each round is fresh answers (no verdict cached from an earlier one), both contenders on the same round, their
order alternating; the headline is the ratio of the median throughputs. Agreement: how often hetrl's verdict
is math-verify's; the guards' rejections (false positives math-verify accepts) are counted apart. Printed
beside it: the same race on the answers only sympy can judge (hetrl's worker path), where the contender
pays for its deadline process.
"""

from __future__ import annotations

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

from hetrl.reward.math_answers import MathVerifier, find_answer, quick_verdict  # noqa: E402

ROUNDS = 7
PROMPTS = 40  # per round
GROUP = 4  # samples per prompt
WORDS = (
    "we compute the sum of terms and note that by symmetry each factor contributes equally so the remaining "
    "case follows from the previous step after we substitute back into the original equation"
).split()
UNITS = ("\\text{ cm}", "\\text{ miles}", "\\textnormal{ km}", "\\text{ cm}^2", "\\mbox{ kg}", " \\text{dollars}")


def chain_of_thought(rng: random.Random) -> str:
    lines = []
    while sum(map(len, lines)) < rng.randint(1500, 4000):
        a, b, c = rng.randint(2, 99), rng.randint(2, 9), rng.randint(1, 50)
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20)))
        math = f"$x = {a} \\cdot \\frac{{{b}}}{{{b + 1}}} + {c}$"
        lines.append(f"{words.capitalize()}, so {math} and the count is {a + c}.")
    return "\n".join(lines)


def matrix(entries: list[int], env: str = "pmatrix") -> str:
    return f"\\begin{{{env}}}{entries[0]}&{entries[1]}\\\\{entries[2]}&{entries[3]}\\end{{{env}}}"


def problem(rng: random.Random) -> tuple[str, list[str], list[str]]:
    """(reference, right answers in equivalent forms, wrong answers) of one prompt."""
    kind = rng.choices(
        ["integer", "fraction", "decimal", "units", "matrix", "set", "interval", "tuple", "equation"],
        [30, 12, 6, 14, 10, 9, 9, 5, 5],
    )[0]
    n, m = rng.randint(2, 500), rng.randint(2, 40)
    if kind == "integer":
        return str(n), [str(n)], [str(n + rng.randint(1, 9)), str(-n)]
    if kind == "fraction":
        b = rng.choice([4, 5, 8, 3, 7])
        a = rng.choice([k for k in range(1, 3 * b) if k % b and all(k % p or b % p for p in (2, 3, 5, 7))])
        right = [f"\\frac{{{a}}}{{{b}}}", f"\\dfrac{{{a}}}{{{b}}}", f"{a}/{b}"]
        right += [str(a / b)] if b in (4, 5, 8) else []  # a terminating decimal
        return f"\\frac{{{a}}}{{{b}}}", right, [f"\\frac{{{a + 1}}}{{{b}}}", f"\\frac{{{b}}}{{{a}}}"]
    if kind == "decimal":
        value = n / 4
        return str(value), [str(value), f"\\frac{{{n}}}{{4}}"], [str(value + 0.5)]
    if kind == "units":
        return str(n), [f"{n}{rng.choice(UNITS)}", str(n)], [f"{n + 1}{rng.choice(UNITS)}"]
    if kind == "matrix":
        entries = [rng.randint(-9, 9) for _ in range(4)]
        doubled, plus_one = [2 * e for e in entries], [e + 1 for e in entries]
        right = [matrix(doubled), matrix(doubled, "bmatrix"), f"2{matrix(entries)}"]
        return matrix(doubled), right, [matrix(plus_one), matrix(entries)]
    if kind == "set":
        roots = rng.sample(range(-20, 21), 3)
        shuffled = rng.sample(roots, 3)
        wrong = [roots[0], roots[1], roots[2] + 1]
        listed = ", ".join(map(str, shuffled))
        return ", ".join(map(str, roots)), [listed, f"\\{{{listed}\\}}"], [", ".join(map(str, wrong))]
    if kind == "interval":
        lo, hi = sorted(rng.sample(range(-20, 21), 2))
        return f"[{lo}, {hi})", [f"[{lo},{hi})", f"x \\in [{lo}, {hi})"], [f"({lo}, {hi}]", f"[{lo}, {hi + 1})"]
    if kind == "tuple":
        return f"({n}, {m})", [f"({n},{m})"], [f"({m}, {n})"]
    return f"y = {m}x + {n}", [f"y={m}x+{n}", f"y = {n} + {m}x"], [f"y = {m}x - {n}"]


def completion(rng: random.Random, answer: str) -> str:
    body, style = chain_of_thought(rng), rng.random()
    if style < 0.85:
        return f"{body}\nTherefore the answer is $\\boxed{{{answer}}}$."
    if style < 0.95:
        return f"{body}\nThe final answer is ${answer}$."
    return f"{body}\nPutting it together, we obtain ${answer}$, as claimed."


def make_round(seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    cases = []
    for _ in range(PROMPTS):
        gold, right, wrong = problem(rng)
        favourite = rng.choice(right)  # a policy tends to write its answer one way
        for _ in range(GROUP):
            right_answer = favourite if rng.random() < 0.7 else rng.choice(right)
            answer = right_answer if rng.random() < 0.6 else rng.choice(wrong)
            cases.append((completion(rng, answer), gold))
    return cases


def bare(completion_text: str, gold: str) -> bool:
    return verify(parse(f"${gold}$"), parse(completion_text))


def timed(fn, cases) -> tuple[float, list]:
    start = time.perf_counter()
    verdicts = [fn(c, g) for c, g in cases]
    return len(cases) / (time.perf_counter() - start), verdicts


def race(verifier: MathVerifier, rounds: list[list[tuple[str, str]]]) -> tuple[list[float], list[float], list]:
    """Both contenders on each round, their order alternating: (hetrl rates, math-verify rates, verdict pairs)."""
    ours, theirs, pairs = [], [], []
    for i, cases in enumerate(rounds):
        contenders = [("hetrl", verifier.verify), ("bare", bare)]
        results = {name: timed(fn, cases) for name, fn in (contenders if i % 2 == 0 else contenders[::-1])}
        ours.append(results["hetrl"][0])
        theirs.append(results["bare"][0])
        pairs += zip(results["hetrl"][1], results["bare"][1])
    return ours, theirs, pairs


def rates(name: str, values: list[float]) -> str:
    return f"{name} {statistics.median(values):7.1f} verifications/s (rounds: {', '.join(f'{x:.0f}' for x in values)})"


def main() -> None:
    rounds = [make_round(i) for i in range(ROUNDS)]
    in_process = sum(quick_verdict(find_answer(c), g) is not None for cases in rounds for c, g in cases)
    # the answers only sympy can judge, apart: fresh ones, so that no verdict is cached yet
    hard = [[(c, g) for c, g in make_round(1000 + i) if quick_verdict(find_answer(c), g) is None] for i in range(3)]
    verifier = MathVerifier(timeout_s=5.0, workers=1)
    try:
        race(verifier, [make_round(10_000)])  # worker start-up and first parses, untimed, on answers no round reuses
        guarded, baseline, pairs = race(verifier, rounds)
        hard_guarded, hard_baseline, _ = race(verifier, hard)
    finally:
        verifier.close()
    same = sum(ours.correct == theirs for ours, theirs in pairs)
    guards = Counter("/".join(ours.flags) for ours, theirs in pairs if theirs and not ours.correct and ours.flags)
    total = len(pairs)
    print(
        f"{ROUNDS} rounds of {PROMPTS * GROUP} verifications ({PROMPTS} prompts x {GROUP} samples), fresh answers; "
        f"{in_process / total:.0%} decided in process"
    )
    print(rates("hetrl MathVerifier (guards, 1 worker):", guarded))
    print(rates("math-verify parse+verify (direct):    ", baseline))
    print(
        f"agreement with math-verify: {same}/{total} = {same / total:.1%}; guards rejecting what math-verify "
        f"accepts: {dict(guards) or 0}; other differences: {total - same - sum(guards.values())}"
    )
    n_hard = sum(map(len, hard))
    print(
        f"answers needing sympy only ({n_hard} in 3 rounds): hetrl {statistics.median(hard_guarded):.1f}/s vs "
        f"math-verify {statistics.median(hard_baseline):.1f}/s "
        f"({statistics.median(hard_guarded) / statistics.median(hard_baseline):.2f}x)"
    )
    print(f"math_verify: {statistics.median(guarded) / statistics.median(baseline):.2f}x (goal >= 1.0x)")


if __name__ == "__main__":
    main()
