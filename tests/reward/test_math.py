import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import pytest
import sympy
from math_verify import parse, verify

from hetrl.records import Sample
from hetrl.reward.deadline import DeadlineCaller
from hetrl.reward.hacking import MULTIPLE_ANSWERS
from hetrl.reward.math_answers import (
    ERROR,
    NO_ANSWER,
    PARTIAL_PARSE,
    TIMEOUT,
    TOLERANCE_FALSE_POSITIVE,
    FinalAnswer,
    MathReward,
    MathVerdict,
    MathVerifier,
    _sympy_verdict,
    _tolerance_ok,
    boxed_contents,
    check_answer,
    find_answer,
    quick_verdict,
)


def cot(seed: int, steps: int = 30) -> str:
    """A deterministic chain of thought (~3,000 characters) full of numbers and inline math, no final answer."""
    lines = []
    for i in range(steps):
        a, b = (seed * 31 + i * 17) % 97 + 2, (seed * 7 + i * 5) % 13 + 2
        lines.append(
            f"Step {i + 1}: we multiply the {a} terms by $\\frac{{{b}}}{{{b + 1}}}$, "
            f"so $x_{{{i}}} = {a * b}$, and the remainder is {a % b}, which we keep for later."
        )
    return "\n".join(lines)


def box(answer: str) -> str:
    return f"\\boxed{{{answer}}}"


LONG_VERIFICATION = " Let me double-check: 6 times 7 is 42, and 40 + 2 = 42, so step 3 was right." * 12  # ~900 chars
LONG_CHECK = " We check it: three quarters of the tank remain after a quarter is used." * 10
M = r"\begin{pmatrix}1&2\\3&4\end{pmatrix}"
M_PLUS_I = r"\begin{pmatrix}1&2\\3&4\end{pmatrix}+\begin{pmatrix}1&0\\0&1\end{pmatrix}"

# (completion, reference): hetrl's verdict must be math-verify's own (parse + verify called directly).
AGREEMENT = [
    # plain numbers (decided in process)
    (box("42"), "42"),
    (box("0.5"), r"\frac12"),
    (box(r"\frac{6}{8}"), "0.75"),
    (box("3/4"), r"\frac{3}{4}"),
    (box(r"-\dfrac{3}{4}"), "-0.75"),
    (box("007"), "7"),
    (box(".5"), "1/2"),
    (box("+5"), "5"),
    (box("5."), "5"),
    (box("0.333333"), r"\frac13"),
    (box("0.3333333"), r"\frac13"),
    (box("0.33"), r"\frac13"),
    (box("7"), "8"),
    (box(r"\$18"), "18"),
    (box("1,000"), "1000"),
    (box(r"50\%"), "50"),
    (box(r"50\%"), "0.5"),
    (box(r"33.3333\%"), r"\frac13"),
    (box(r"30^\circ"), "30"),
    (box(r"\frac{1}{0}"), "1"),
    # units
    (r"The side is \boxed{5\text{ cm}}", "5"),
    (r"so \boxed{12\textnormal{ miles}}", "12"),
    (box(r"5\text{ cm}^2"), "5"),
    (box(r"5 \text{ dollars}"), "5"),
    (box("5 cm"), "5"),
    (box(r"5 \, \text{cm}"), "5"),
    (box(r"2.5\mbox{ kg}"), "2.5"),
    (box(r"5 \text{m}/\text{s}"), "5"),
    (box(r"\frac{3}{4}\text{ of the pie}"), "0.75"),
    (box(r"6\text{ cm}"), "5"),
    (r"\boxed{2}\text{ cm}", "2"),
    (box(r"10\mathrm{m}"), "10"),
    # matrices, also written as a sum or a product (sympy recursed on these in the tolerance re-check)
    (box(M), M),
    (box(M), r"\begin{pmatrix}1&2\\3&5\end{pmatrix}"),
    (box(M_PLUS_I), r"\begin{pmatrix}2&2\\3&5\end{pmatrix}"),
    (box("2" + M), r"\begin{pmatrix}2&4\\6&8\end{pmatrix}"),
    (box("2" + M), M),
    (box(r"\begin{bmatrix}0.5\\1\end{bmatrix}"), r"\begin{pmatrix}\frac12\\1\end{pmatrix}"),
    # sets and tuples
    (box(r"\{1,2\}"), r"\{1,2\}"),
    (box(r"\{2,1\}"), r"\{1,2\}"),
    (box("4,-8,-10"), "-10,-8,4"),
    (box("-10,-8,4"), "a=4,-8,-10"),
    (box("-10,-8"), "a=4,-8,-10"),
    (r"\boxed{2}, \boxed{3}", "2,3"),
    (r"\boxed{2} and \boxed{3}", r"\{2,3\}"),
    (box("3"), "3,5"),
    (box(r"\{3\}"), "3"),
    (box("3"), r"\{3\}"),
    (box("(1,2)"), "(1,2)"),
    (box("1,2"), "(1,2)"),
    (box("(2,1)"), "(1,2)"),
    (box("(4,-8,-10)"), "(-10,-8,4)"),
    (box("(3, -1, 2)"), "(3,-1,2)"),
    # intervals
    (box("[1,2)"), "[1,2)"),
    (box("(1,2]"), "[1,2)"),
    (box(r"x \in [1,2)"), "[1,2)"),
    (box("[1,2)"), r"x\in[1,2)"),
    (box(r"(-\infty, 3]"), r"(-\infty,3]"),
    (box(r"(-\infty,1)\cup(2,\infty)"), r"(-\infty,1)\cup(2,\infty)"),
    # equations and expressions
    (box("x=5"), "5"),
    (box("5"), "x=5"),
    (box("y=5"), "x=5"),
    (box("y = 2x + 1"), "y=2x+1"),
    (box("x^2+2x+1"), "(x+1)^2"),
    (box(r"\sqrt{2}"), r"\frac{2}{\sqrt{2}}"),
    (box(r"\frac{\pi}{2}"), r"\frac{\pi}{3}"),
    (box(r"\frac{1}{2^{99}}"), r"\frac{1}{2^{99}}"),
    (box("10^{10^{3}}"), "1"),
    # long chains of thought: boxed early or late, unboxed early (more than 500 characters before the end) or late
    (cot(1) + "\nTherefore the answer is $\\boxed{42}$.", "42"),
    (cot(2) + "\nSo $\\boxed{\\frac{3}{4}}$ of the tank is full.", "0.75"),
    (cot(3) + "\nThe area is $\\boxed{12\\text{ cm}^2}$.", "12"),
    (cot(4) + f"\nHence $M = {box(M)}$.", M),
    (cot(5) + "\nThe solution set is $\\boxed{[1,2)}$.", "[1,2)"),
    ("First, \\boxed{42}." + LONG_VERIFICATION, "42"),
    (box("4") + LONG_CHECK + " So the final answer is $\\frac{1}{2}$.", "0.5"),  # stated after the box: it counts
    (cot(6) + "\nThe answer is 42." + LONG_VERIFICATION, "42"),
    ("The answer is $\\frac{3}{4}$." + LONG_CHECK, r"\frac34"),
    ("The answer is $\\frac{3}{4}$." + LONG_VERIFICATION, r"\frac34"),  # math-verify reads the later "= 42"
    (cot(7) + "\nThe final answer is 17.", "17"),
    (cot(8) + "\nThe final answer is 17.", "18"),
    (cot(9), "42"),
    ("no answer here", "8"),
    # unboxed plain numbers (an answer tag's content)
    ("7", "7"),
    (" 12 ", "12"),
    ("-3", "-3"),
    ("007", "7"),
    ("0.5", "1/2"),
    ("7", "8"),
    ("-7", "7"),
    ("123456789012345678901234567890", "123456789012345678901234567891"),
]


# Math-verify accepts these; the guards reject them, each with its flag.
GUARDED = [
    (box(r"\frac{1}{2^{98}}"), r"\frac{1}{2^{99}}", TOLERANCE_FALSE_POSITIVE),  # equal only after chop
    (box("0.000000"), r"\frac{1}{2^{99}}", TOLERANCE_FALSE_POSITIVE),
    (box("12345 6789"), "19134", PARTIAL_PARSE),  # sympy adds the juxtaposed numbers
    (box(r"3 \text{ hours } 20 \text{ minutes}"), "3", PARTIAL_PARSE),  # read as 3
    (box(r"5 \mbox{ and } \sqrt{2}"), "5", PARTIAL_PARSE),
    (box(r"5\text{ then }x^{2}"), "5", PARTIAL_PARSE),
    (box(r"5 \text{ (or 7)}"), "5", MULTIPLE_ANSWERS),
    (box("7") + LONG_VERIFICATION + box("4"), "4", MULTIPLE_ANSWERS),
    (box("7") + LONG_VERIFICATION + r"\boxed{2}, \boxed{3}", "2,3", MULTIPLE_ANSWERS),
]


def math_verify_verdict(completion: str, gold: str) -> bool:
    return verify(parse(f"${gold}$"), parse(completion))


@pytest.mark.parametrize("completion, gold", AGREEMENT, ids=range(len(AGREEMENT)))
def test_verdicts_agree_with_math_verify(completion, gold):
    verdict = check_answer(completion, gold)
    assert verdict.correct is math_verify_verdict(completion, gold), verdict
    assert ERROR not in verdict.flags


# (completion, reference, correct): forms math-verify misreads (hetrl.reward.math_forms), and wrong twins of them
RESTATED = [
    (box(r"1 \le x < 2"), "[1,2)", True),  # an inequality for an interval
    (box(r"-2 \le x \le 7"), r"x \in [-2,7]", True),
    (box(r"x \ge 3"), r"[3, \infty)", True),
    (box(r"-2 \le x \le 0.333333"), r"[-2, \frac{1}{3}]", True),  # with a rounded end
    (box(r"1 < x < 2"), "[1,2)", False),
    (box("1,22"), "1.22", True),  # a decimal comma
    (box("1{,}5"), "1.5", True),
    ("Das Ergebnis ist 3,75.", "3.75", True),
    (box("1,23"), "1.22", False),
    (box("1,220"), "1.22", False),  # three digits: thousands
    (box(r"f(t) = t^2 + 1"), "f(x) = x^2 + 1", True),  # a renamed function variable
    (box(r"f(t) = t^2 + x"), "f(x) = x^2 + 1", False),
    (box(r"f(t) = 3t^2 - 2074 t"), "f(x) = 3x^2 - 2074x", True),  # math-verify drops the last t as a unit
    (box(r"f(t) = 3t^2 - 2074 t"), "f(t) = 3t^2 - 2074", False),  # ... and would accept this
    (
        box("10x + 32y = -124"),
        "5x + 16y = -62",
        True,
    ),  # an equation rescaled (the tolerance guard took it for a scalar)
    (box("10x + 32y = -123"), "5x + 16y = -62", False),
    (box("0.000916"), r"\frac{15}{16384}", True),  # 6 places, 3 significant digits
    ("The probability is 7/20.", r"\frac{7}{20}", True),  # math-verify reads "20." as a float
    ("The probability is 7/21.", r"\frac{7}{20}", False),
]


@pytest.mark.parametrize("completion, gold, correct", RESTATED, ids=range(len(RESTATED)))
def test_forms_math_verify_misreads_are_read_as_they_are_meant(completion, gold, correct):
    verdict = check_answer(completion, gold)
    assert verdict.correct is correct and ERROR not in verdict.flags, verdict


@pytest.mark.parametrize("completion, gold, flag", GUARDED, ids=range(len(GUARDED)))
def test_guards_reject_what_math_verify_accepts(completion, gold, flag):
    assert math_verify_verdict(completion, gold)
    verdict = check_answer(completion, gold)
    assert not verdict.correct and verdict.flags == [flag], verdict


@pytest.mark.parametrize(
    "completion, gold, correct, flag",
    [
        (r"\boxed{2} and then \boxed{3}", "3", False, MULTIPLE_ANSWERS),
        (box("5 or 7"), "5", False, MULTIPLE_ANSWERS),
        (box(r"3 \text{ or } 4"), "4", False, MULTIPLE_ANSWERS),
        (box("3, 5"), "3", False, MULTIPLE_ANSWERS),
        (r"\boxed{3} is wrong, so it must be \boxed{4}", "4", False, MULTIPLE_ANSWERS),  # math-verify reads {3, 4}
        (box("3, 5"), "x=3", False, MULTIPLE_ANSWERS),
        (box("2.5.3"), "2.5", False, PARTIAL_PARSE),
        (r"x = \boxed{3}, i.e. \boxed{3}", "3", True, None),  # the same answer twice is fine
        (box("3") + LONG_VERIFICATION + box("3"), "3", True, None),
        ("no answer here", "8", False, NO_ANSWER),
        (box("5"), "", False, NO_ANSWER),  # an empty reference
    ],
)
def test_guards(completion, gold, correct, flag):
    verdict = check_answer(completion, gold)
    assert verdict.correct is correct, verdict
    assert (flag in verdict.flags) if flag else not verdict.flags


def render(value: Fraction, rng: random.Random, decimal: bool = True) -> str:
    """One of the ways a policy writes an exact value."""
    p, q, sign = value.numerator, value.denominator, "-" if value < 0 else ""
    forms = [
        f"\\frac{{{p}}}{{{q}}}",
        f"{sign}\\frac{{{abs(p)}}}{{{q}}}",
        f"\\dfrac{{{p}}}{{{q}}}",
        f"{sign}{abs(p)}/{q}",
    ]
    if q == 1:
        forms += [str(p), str(p), f"+{p}" if p > 0 else str(p)]
    if decimal and (value * 100).denominator == 1:
        forms.append(str(float(value)))
    return rng.choice(forms)


def plain_answer(kind: str, rng: random.Random) -> tuple[object, Callable[[object], str]]:
    """A random value of one kind and a function writing it in a random surface form."""

    def exact():
        return Fraction(rng.randint(-9, 9), rng.choice([1, 1, 2, 4, 3]))

    def write_set(v):
        body = ", ".join(render(e, rng, False) for e in rng.sample(sorted(v), len(v)))
        return f"\\{{{body}\\}}" if len(v) == 1 or rng.random() < 0.5 else body

    def write_matrix(v):
        env, factor = rng.choice(["pmatrix", "bmatrix"]), rng.choice([1, 2])
        body = "\\\\".join("&".join(render(e / factor, rng, False) for e in row) for row in v)
        return f"{factor if factor > 1 else ''}\\begin{{{env}}}{body}\\end{{{env}}}"

    if kind == "number":
        return exact(), lambda v: render(v, rng) + rng.choice(["", "", r"\text{ cm}", r"\textnormal{ miles}"])
    if kind == "set":
        return frozenset(exact() for _ in range(rng.randint(1, 3))), write_set
    if kind == "tuple":
        elements = tuple(exact() for _ in range(rng.randint(2, 3)))
        return elements, lambda v: f"({', '.join(render(e, rng, False) for e in v)})"
    if kind == "interval":
        low, high = sorted(rng.sample(range(-9, 10), 2))
        ends = rng.choice([str(low), r"-\infty"]), rng.choice([str(high), r"\infty"])
        ends += rng.choice("(["), rng.choice(")]")
        return ends, lambda v: f"{v[2]}{v[0]}, {v[1]}{v[3]}"
    rows = tuple(tuple(Fraction(2 * rng.randint(-4, 4)) for _ in range(2)) for _ in range(rng.randint(1, 2)))
    return rows, write_matrix


@pytest.mark.parametrize("seed", range(4))
def test_plain_answers_in_process_match_the_worker_and_math_verify(seed):
    """Every verdict the in-process reader gives is the one the worker (math-verify + guards) and math-verify give."""
    rng, decided = random.Random(seed), 0
    for _ in range(30):
        kind = rng.choice(["number", "set", "tuple", "interval", "matrix"])
        value, write = plain_answer(kind, rng)
        other = value if rng.random() < 0.6 else plain_answer(kind, rng)[0]
        gold, written = write(value), write(other)
        completion = rng.choice([f"so {box(written)}.", f"{cot(seed, 3)}\nThe final answer is ${written}$.", written])
        answer = find_answer(completion)
        fast = quick_verdict(answer, gold)
        if fast is None:
            continue
        decided += 1
        slow = _sympy_verdict(answer, gold, 1e-6)
        assert (fast.correct, fast.flags) == (slow.correct, slow.flags), (completion, gold, fast, slow)
        assert fast.flags or fast.correct is math_verify_verdict(completion, gold), (completion, gold, fast)
    assert decided >= 15


@pytest.mark.parametrize(
    "text",
    [
        "7",
        "0.5",
        r"\frac{3}{4}",
        r"5\text{ cm}",
        "3/4",
        r"12\textnormal{ miles}",
        "1,000",
        r"\{1, 2\}",
        "-10,-8,4",
        "(1, 2)",
        "[1, 2)",
        r"(-\infty, 3]",
        "2" + M,
    ],
)
def test_plain_answers_skip_sympy(text):
    assert quick_verdict(find_answer(box(text)), text).correct


@pytest.mark.parametrize(
    "text",
    [
        "x+1",
        r"\sqrt{2}",
        r"3 \text{ hours } 20",
        r"50\%",
        r"\frac{1}{0}",
        "0.1234567890123456",
        "1,000, 2",
        "[5, 2)",
        r"x \in [1, 2)",
        r"\{0.5, 1\}",
        r"\begin{vmatrix}1&2\\3&4\end{vmatrix}",
    ],
)
def test_anything_else_goes_to_the_worker(text):
    assert quick_verdict(find_answer(box(text)), text) is None


@pytest.mark.parametrize(
    "completion, decided",
    [
        (cot(1) + "\nThe final answer is $\\frac{3}{4}$.", True),
        (cot(1) + "\nFinal Answer: The final answer is $5\\text{ cm}$. I hope it is correct.", True),
        (cot(1) + "\nThe final answer is 17.", True),
        ("The final answer is $2$, I think. Checking again, the final answer is $3$.", False),  # the first can outrank
        ("The final answer is $2$. I hope it is correct. Or rather, the final answer is $3$.", False),
        (cot(1) + "\nSo the answer is 17.", False),
    ],
)
def test_unboxed_answers_in_process_only_where_math_verify_is_certain(completion, decided):
    assert (quick_verdict(find_answer(completion), "17") is not None) is decided


def test_find_answer_joins_boxes_as_math_verify_does():
    assert find_answer("\\boxed{2}, \\boxed{3}") == FinalAnswer("2,3", True, 2)
    assert find_answer("x = \\boxed{3}, i.e. \\boxed{3}") == FinalAnswer("3", True, 1)
    far = find_answer("\\boxed{7}" + LONG_VERIFICATION + "\\boxed{4}")
    assert (far.text, far.stray) == ("4", "7")
    assert find_answer("The answer is 4.") == FinalAnswer("The answer is 4.", False)


def test_boxed_contents_balanced_and_linear():
    assert boxed_contents("a \\boxed{\\frac{1}{2}} b \\boxed{x^{2}} \\boxed{open") == ["\\frac{1}{2}", "x^{2}"]
    start = time.monotonic()
    assert boxed_contents("\\boxed{" * 20000) == []  # nested unclosed boxes: one pass, not one scan per box
    assert time.monotonic() - start < 1.0


def test_sympy_failures_keep_math_verifys_verdict(monkeypatch):
    """The tolerance re-check once recursed without end on a matrix product; a failure there is sympy's."""
    matrix = sympy.Matrix([[1, 2], [3, 4]])
    assert _tolerance_ok(matrix, 2 * sympy.MatMul(matrix, sympy.Identity(2)), 1e-6)

    def recurse(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(sympy, "N", recurse)
    assert _tolerance_ok(sympy.Rational(1, 3), sympy.Float("0.333333"), 1e-6)


def test_deadline_kills_and_replaces_worker():
    caller = DeadlineCaller(time.sleep, workers=1, timeout_s=0.5)
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            caller.call(30)
        assert time.monotonic() - start < 5
        assert caller.call(0) is None and caller.restarts == 1
    finally:
        caller.close()


@pytest.fixture(scope="module")
def verifier():
    v = MathVerifier(timeout_s=20.0)
    yield v
    v.close()


def test_verifier_workers_score_what_check_answer_scores(verifier):
    cases = [
        (box("2" + M), r"\begin{pmatrix}2&4\\6&8\end{pmatrix}"),
        (box("-10,-8,4"), "a=4,-8,-10"),
        (box("x^2+2x+1"), "(x+1)^2"),
        (cot(1) + " The answer is 42.", "42"),
        (box(r"\frac{1}{2^{98}}"), r"\frac{1}{2^{99}}"),
    ]
    for completion, gold in cases:
        assert verifier.verify(completion, gold) == check_answer(completion, gold)


def test_worker_verdicts_are_cached_per_answer_and_reference(verifier, monkeypatch):
    calls = []
    monkeypatch.setattr(verifier._caller, "call", lambda *args: calls.append(args) or MathVerdict(True, [], "correct"))
    verifier.verify("first \\boxed{\\sqrt{7}}", "\\sqrt{7}")
    verifier.verify("another chain of thought, same \\boxed{\\sqrt{7}}", "\\sqrt{7}")
    verifier.verify("\\boxed{\\sqrt{7}}", "\\sqrt{8}")
    assert len(calls) == 2
    verdict = verifier.verify("\\boxed{\\sqrt{7}}", "\\sqrt{7}")
    verdict.flags.append("mutated")  # the caller owns its copy
    assert verifier.verify("\\boxed{\\sqrt{7}}", "\\sqrt{7}").flags == []


def test_a_dead_worker_is_an_error_not_a_cached_verdict(verifier, monkeypatch):
    def dead(*args):
        raise RuntimeError("worker died")

    monkeypatch.setattr(verifier._caller, "call", dead)
    assert verifier.verify("\\boxed{\\sqrt{5}}", "\\sqrt{5}").flags == [ERROR]
    monkeypatch.undo()
    assert verifier.verify("\\boxed{\\sqrt{5}}", "\\sqrt{5}").correct


def test_math_reward_off_main_thread():
    reward = MathReward(timeout_s=20.0)
    try:
        samples = [
            Sample(f"s{i}", "g", "math", [1], [], [], [], [], completion_text=box(f"\\sqrt{{{i}}}"), answer="\\sqrt{3}")
            for i in range(5)
        ]
        with ThreadPoolExecutor(2) as ex:
            values = list(ex.map(reward, samples))
        assert [v.score for v in values] == [0.0, 0.0, 0.0, 1.0, 0.0]
    finally:
        reward.close()


def test_a_runaway_sympy_call_times_out_and_spares_the_rest():
    """math-verify (signal timeouts off) spins on 10^(10^10) vs 1: the deadline kills the worker, not the run."""
    verifier = MathVerifier(timeout_s=1.0)
    try:
        start = time.monotonic()
        assert verifier.verify("\\boxed{10^{10^{10}}}", "1").flags == [TIMEOUT]
        assert verifier.verify("another sample: \\boxed{10^{10^{10}}}", "1").flags == [
            TIMEOUT
        ]  # not cached: asked again
        assert time.monotonic() - start < 15
        assert verifier.verify("\\boxed{1}", "1").correct  # plain numbers never wait on a worker
        assert verifier.verify("\\boxed{10^{10^{10}}}", "10^{10^{10}}").correct  # a fresh worker
    finally:
        verifier.close()


def test_answer_tag_ignores_digits_outside_the_tags():
    """Without tags, math-verify reads the last number anywhere: noise containing the right digit pays."""

    def sample(text):
        return Sample("s", "g", "t", [1], [2], [1], [0.0], [0], completion_text=text, answer="5")

    untagged, tagged = MathReward(timeout_s=20.0), MathReward(timeout_s=20.0, answer_tag="answer")
    try:
        assert untagged(sample('OHv=5ontC"')).score == 1.0  # the false positive the tag closes
        assert tagged(sample('OHv=5ontC"')).score == 0.0
        assert tagged(sample("<answer>5</answer>")).score == 1.0
        assert tagged(sample("<answer>3</answer> 5 <answer>5</answer>")).score == 1.0  # the last tag counts
        assert tagged(sample("5 <answer>4</answer>")).score == 0.0
    finally:
        untagged.close()
        tagged.close()
