"""Math answers checked as math-verify checks them, fast, under our own deadline, with guards for its false positives.

Where the answer is: the last ``\\boxed{}``, together with the boxes math-verify joins to it into one answer
(adjacent ones, or ones separated by "and", "or" or a comma: ``\\boxed{2}, \\boxed{3}`` is the set {2, 3}).
With nothing boxed, math-verify's own extraction reads the whole completion (its last "answer ..."
statement, else its last number or formula), however far from the end that is.

How it is checked: where answer and reference are both plain (numbers, also with a unit, a currency sign or
thousands commas; sets, tuples, intervals and matrices of exact numbers), in process, to the verdict
math-verify reaches (tested against it), without sympy: most answers are plain, and sympy's LaTeX parser
costs 2-50 ms an answer. Everything else runs math-verify's parse and verify in a ``DeadlineCaller`` worker
process: math-verify's own timeouts use ``signal.alarm`` (main thread only) and a sympy call can spin or
recurse without end, so a deadline kills the worker instead (``math/timeout``, score 0). Worker verdicts are cached per
(answer, reference): the samples of a GRPO group share a reference and often an answer. A timeout is
not: under load a right answer may time out once, and it must not stay wrong for the rest of the run.

Guards, each with a named flag, for false positives that math-verify alone accepts:

* different boxed answers outside one final group, or several values (``\\boxed{5 or 7}``, ``\\boxed{3, 5}``,
  ``\\boxed{2} and \\boxed{3}``) where the reference is one value: the policy is hedging ->
  ``hack/multiple_answers``, score 0. A set, tuple, interval or matrix reference (``a=4,-8,-10``) takes several;
* a box whose numbers or math the parser dropped (``3 \\text{ hours } 20 \\text{ minutes}`` read as 3, a number
  with two decimal points ``2.5.3`` read as 2.5*0.3, numbers only juxtaposed by a space ``12345 6789``, which
  sympy multiplies or adds) -> ``math/partial_parse``, score 0. A unit it drops (``5\\text{ cm}``,
  ``12\\textnormal{ miles}``, ``5 cm``) is fine;
* numeric tolerance: math-verify compares after rounding, so 1/2^99 "equals" 1/2^98; an accepted numeric pair
  must also agree to a RELATIVE tolerance -> otherwise ``math/tolerance_false_positive``. A decimal answer of
  magnitude >= 1e-4 keeps math-verify's 6-decimal rounding (``0.333333`` for 1/3, ``0.000916`` for 15/16384):
  there it compares at least 3 significant digits.

Forms math-verify misreads are read as they are meant (hetrl.reward.math_forms): a decimal comma where the
reference is one value, an inequality chain for an interval, ``f(t) = ...`` for ``f(x) = ...``, a trailing
variable its unit removal would drop, the full stop after ``7/20.``.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import lru_cache
from typing import Any

import sympy
from latex2sympy2_extended.math_normalization import NormalizationConfig, normalize_latex
from math_verify import parse, verify
from math_verify.grader import get_pct_val
from sympy.matrices.expressions import MatrixExpr

from hetrl.reward.base import RewardValue, Scorable
from hetrl.reward.deadline import DeadlineCaller
from hetrl.reward.hacking import MULTIPLE_ANSWERS
from hetrl.reward.math_forms import braced_variable_tail, decimal_commas, restatements, sentence_stops

# math-verify warns on every call that its (signal-based) timeouts are off: we hold the deadline.
logging.getLogger("math_verify").setLevel(logging.ERROR)

PARTIAL_PARSE = "math/partial_parse"
TOLERANCE_FALSE_POSITIVE = "math/tolerance_false_positive"
TIMEOUT = "math/timeout"
NO_ANSWER = "math/no_answer"
ERROR = "math/error"

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACES = re.compile(r"[{}]")
_JUXTAPOSED = re.compile(r"\d\s+\d|\d\.\d+\.\d")  # "12 34" (sympy multiplies/adds), "2.5.3" (read as 2.5*0.3)
_ALTERNATIVES = re.compile(r"\bor\b|\\lor\b|\\vee\b")
_BOX_SEPARATOR = re.compile(r"\b(?:and|or)\b|,|;")  # math-verify joins boxes this close into one answer
_SPACE = re.compile(r"\s+")

# A tail math-verify may drop as a unit: \text{}/\mbox{} groups without digits (with a power: cm^2), spacing
# and "/" between them; or bare words (math-verify drops only the words of its unit list).
_UNIT_TAIL = re.compile(r"(?:\\(?:text|mbox)\{[^{}\d]*\}(?:\^\{?\d\}?)?|\\[,;:!]|\\cdot|/)*|[^\d\\{}^]*")
_BASIC_LATEX = NormalizationConfig(basic_latex=True, units=False, malformed_operators=False, nits=False, boxed="last")
_WITH_UNITS = replace(_BASIC_LATEX, units=True)

# Plain answers, read without sympy. A scalar: an integer, decimal or fraction; at the top level also with a
# currency sign, thousands commas or a \text{} unit (math-verify drops those).
_FAST_MAX_CHARS = 400  # plain answers are short: longer text goes to the worker without a regex pass
_SCALAR = (
    r"(?P<sign>[-+]?)\s*(?:(?P<num>\d{1,100}(?:\.\d{1,15})?|\.\d{1,15})"
    r"|\\[dt]?frac\s*\{\s*(?P<fn>-?\d{1,50})\s*\}\s*\{\s*(?P<fd>\d{1,50})\s*\}"
    r"|\\[dt]?frac(?P<sn>\d)(?P<sd>\d)|(?P<an>\d{1,50})/(?P<ad>\d{1,50}))"
)
# A unit: words in \text{} (math-verify first rewrites "and", "or", "percent", "inf..." in there), with a power.
_UNIT = (
    r"\\(?:text|textnormal|textrm|textit|textbf|mbox|mathrm|mathit|mathbf)\s*"
    r"\{(?![^}]*(?:\b(?:and|or|percent|percentage|pct|sqrt)\b|inf))[A-Za-z /]*\}(?:\^\d|\^\{\d\})?"
)
# A unit must end the answer: math-verify drops it only there (a space after it keeps it, and the number is lost).
# Thousands commas take no spacing command before a unit: what is left of it hides the number as a set ("1,000\,").
_NUMBER = re.compile(
    rf"(?:\\\$\s*)?(?:(?P<thousands>-?[1-9]\d{{0,2}}(?:(?:,|\{{,\}})\d{{3}})+)\s*(?:{_UNIT})?"
    rf"|{_SCALAR}(?:(?:\s|\\[,;:! ])*{_UNIT}|\s*))"
)
_ELEMENT = re.compile(rf"\s*{_SCALAR}\s*")
_INFINITY = re.compile(r"\s*([-+]?)\s*\\infty\s*")
_THOUSANDS_LIKE = re.compile(r"\d,\d{3}(?!\d)")  # "1,000" in a list: math-verify may read one number
_MATRIX = re.compile(r"\\begin\{([pb]?matrix)\}(.*)\\end\{\1\}", re.DOTALL)
_SIGN_FACTORS = {"": Fraction(1), "+": Fraction(1), "-": Fraction(-1)}
_FRACTION_GROUPS = (("fn", "fd"), ("sn", "sd"), ("an", "ad"))  # \frac{a}{b}, \frac12, a/b
_SIGNIFICANT_DIGITS = 15  # math-verify's floats carry 15: a longer decimal is not compared exactly there
# An unboxed completion read in process: a bare numeral (an answer tag's content), or one that ends by stating
# "the final answer is X" (math-verify's top-priority patterns, when nothing else can outrank that statement).
_NUMERAL_TEXT = r"(?:-(?!0\d))?\d{1,100}(?:\.\d{1,15})?"  # math-verify cannot read "-007"
_NUMERAL = re.compile(rf"\s*({_NUMERAL_TEXT})\s*")
_STATED = re.compile(
    r"(?i:final answer is):?\s*"
    rf"(?:\$(?P<latex>[^$\n]{{1,400}})\$|(?P<numeral>{_NUMERAL_TEXT}))"
    r"(?P<hope>\. ?I hope it is correct\.?)?\.?\s*$"
)
_FINAL_ANSWER = re.compile(r"(?i:final answer)")


@dataclass
class MathVerdict:
    """One answer's verdict: ``flags`` name why a rejected answer was not merely wrong."""

    correct: bool
    flags: list[str] = field(default_factory=list)
    reason: str = ""
    extracted: str = ""


@dataclass(frozen=True)
class FinalAnswer:
    """What a completion states as its final answer, found in process (linear time, no sympy).

    ``text`` is the final group of boxes' contents joined by commas, as math-verify joins them, or the whole
    completion (``boxed`` False) when nothing is boxed or a final answer is stated after the last box:
    math-verify's extraction then reads it. ``distinct`` counts the different answers in that group; ``stray``
    is a different answer boxed before it.
    """

    text: str
    boxed: bool
    distinct: int = 1
    stray: str = ""


def _boxes(text: str) -> list[tuple[int, int, str]]:
    """(start, closing brace, content) of every closed box, braces matched in one pass (an unclosed box is dropped)."""
    closing, stack = {}, []
    for match in _BRACES.finditer(text):
        if match[0] == "{":
            stack.append(match.start())
        elif stack:
            closing[stack.pop()] = match.start()
    out = []
    for match in _BOXED.finditer(text):
        end = closing.get(match.end() - 1)
        if end is not None:
            out.append((match.start(), end, text[match.end() : end].strip()))
    return out


def boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` in ``text`` (balanced braces; an unclosed box is dropped)."""
    return [content for _, _, content in _boxes(text)]


def find_answer(completion: str) -> FinalAnswer:
    """The final answer: the last box and the boxes math-verify joins to it (its ``extract_boxed_content`` rule).

    Boxes are joined when fewer than 10 characters apart, or, holding different answers, fewer than 70 apart
    with "and", "or", a comma or a semicolon between them. A "final answer" stated after the last box is the
    one math-verify reads: the completion is then left to its extraction, as an unboxed one.
    """
    boxes = _boxes(completion)
    if not boxes:
        return FinalAnswer(completion, boxed=False)
    group = [boxes[-1]]
    for box in reversed(boxes[:-1]):
        between = completion[box[1] + 1 : group[-1][0]]
        if len(between) < 10 or (box[2] != group[-1][2] and len(between) < 70 and _BOX_SEPARATOR.search(between)):
            group.append(box)
        else:
            break
    contents = [content for _, _, content in reversed(group)]
    joined = [c for i, c in enumerate(contents) if i == 0 or c != contents[i - 1]]
    distinct = {_SPACE.sub("", c) for c in contents}
    earlier = boxes[: len(boxes) - len(group)]
    stray = next((c for _, _, c in reversed(earlier) if _SPACE.sub("", c) not in distinct), "")
    if _FINAL_ANSWER.search(completion, boxes[-1][1]):  # "The final answer is ..." after the box outranks it
        return FinalAnswer(completion, False, stray=stray)
    return FinalAnswer(",".join(joined), True, len(distinct), stray)


@dataclass(frozen=True)
class _Plain:
    """An answer read without sympy: kind "number" (a Fraction), "set" (a frozenset), "tuple", "interval"
    ((low, high, left open, right open), infinities as (-1, 0) and (1, 0), finite ends as (0, x)) or "matrix"
    (a tuple of rows). Only numbers may be decimals, which math-verify compares after rounding."""

    kind: str
    value: Any
    decimal: bool = False


def _scalar_of(match: re.Match) -> tuple[Fraction, bool] | None:
    """(value, written as a decimal) of a ``_SCALAR`` match; None for a zero denominator (math-verify: zoo)."""
    sign = -1 if match["sign"] == "-" else 1
    if match["num"] is not None:
        decimal = "." in match["num"]
        if decimal and len(match["num"].replace(".", "").lstrip("0")) > _SIGNIFICANT_DIGITS:
            return None
        return sign * Fraction(match["num"]), decimal
    numerator, denominator = next((match[n], match[d]) for n, d in _FRACTION_GROUPS if match[n])
    if int(denominator) == 0:
        return None
    return sign * Fraction(int(numerator), int(denominator)), False


def _exact(text: str) -> Fraction | None:
    """An exact element of a set, tuple, interval or matrix; None for decimals and anything else."""
    match = _ELEMENT.fullmatch(text)
    scalar = _scalar_of(match) if match else None
    return scalar[0] if scalar and not scalar[1] else None


def _read_matrix(text: str) -> _Plain | None:
    """``\\begin{pmatrix}..\\end{pmatrix}`` (or bmatrix, matrix) of exact entries, with an optional factor in front."""
    start = text.find("\\begin{")
    match = _MATRIX.fullmatch(text, start) if start >= 0 else None
    if match is None:
        return None
    factor_text = text[:start].strip()
    factor = _SIGN_FACTORS[factor_text] if factor_text in _SIGN_FACTORS else _exact(factor_text)
    body = match[2].strip().removesuffix("\\\\")
    rows = [[_exact(cell) for cell in row.split("&")] for row in body.split("\\\\")]
    if not factor or any(None in row or len(row) != len(rows[0]) for row in rows):  # a zero factor: the worker decides
        return None
    return _Plain("matrix", tuple(tuple(factor * cell for cell in row) for row in rows))


def _endpoint(text: str) -> tuple[int, Fraction] | None:
    """An interval end or tuple element, ordered as (-infinity, finite, +infinity) by the first item."""
    infinity = _INFINITY.fullmatch(text)
    if infinity:
        return (-1 if infinity[1] == "-" else 1), Fraction(0)
    value = _exact(text)
    return None if value is None else (0, value)


def _read_collection(text: str) -> _Plain | None:
    """A set (``\\{1, 2\\}`` or a bare ``1, 2``), a tuple ``(1, 2)`` or an interval ``[1, 2)``, ``(-\\infty, 3]``.

    As math-verify reads them: a set drops repeats; ``(a, b)`` is an ordered pair (an open interval when a < b,
    compared as a pair); an interval's infinite ends are open. Anything unusual (an empty or reversed interval,
    thousands-like commas) is left to the worker.
    """
    braced, bracketed = text.startswith("\\{") and text.endswith("\\}"), text[0] in "([" and text[-1] in ")]"
    inner = text[2:-2] if braced else text[1:-1] if bracketed else text
    parts = inner.split(",")
    if _THOUSANDS_LIKE.search(inner) or not (braced or bracketed or len(parts) > 1):
        return None
    if not bracketed:
        values = [_exact(part) for part in parts]
        return None if None in values else _Plain("set", frozenset(values))
    ends = [_endpoint(part) for part in parts]
    if None in ends or len(ends) < 2:
        return None
    if (text[0], text[-1]) == ("(", ")") and all(end[0] == 0 for end in ends):
        return _Plain("tuple", tuple(end[1] for end in ends))
    if len(ends) != 2 or not ends[0] < ends[1]:
        return None
    low, high = ends
    left_open, right_open = text[0] == "(" or low[0] != 0, text[-1] == ")" or high[0] != 0
    return _Plain("interval", (low, high, left_open, right_open))


def _read_plain(text: str) -> _Plain | None:
    """A plain answer (see ``_Plain``) as math-verify would parse it, or None: the worker reads the rest."""
    text = text.lstrip()
    if not text.strip() or len(text) > _FAST_MAX_CHARS:
        return None
    match = _NUMBER.fullmatch(text)
    if match:
        if match["thousands"]:
            digits = Fraction(re.sub(r"\D", "", match["thousands"]))
            return _Plain("number", -digits if match["thousands"].startswith("-") else digits)
        scalar = _scalar_of(match)
        return _Plain("number", *scalar) if scalar else None
    return _read_matrix(text.rstrip()) if "\\begin{" in text else _read_collection(text.rstrip())


def _stated_answer(completion: str) -> str | None:
    """The answer of an unboxed completion where math-verify's pick is certain without its regexes, else None.

    A bare numeral, or a last sentence "The final answer is X." (optionally "... I hope it is correct."): the
    statement math-verify ranks first, as long as no box and no other "final answer" or "I hope" can outrank it.
    """
    numeral = _NUMERAL.fullmatch(completion) if len(completion) <= _FAST_MAX_CHARS else None
    if numeral:
        return numeral[1]
    stated = _STATED.search(completion, max(0, len(completion) - 500))
    if stated is None or "\\boxed" in completion or "\\fbox" in completion or (stated["latex"] or "").endswith("\\"):
        return None
    if not stated["hope"] and ("I hope" in completion or len(_FINAL_ANSWER.findall(completion)) > 1):
        return None
    return stated["latex"] or stated["numeral"]


def _plain_verdict(reference: _Plain, value: _Plain, extracted: str, boxed: bool) -> MathVerdict | None:
    """math-verify's verdict on two plain answers (and the hedging guard's, for a box), or None when unsure."""
    right, wrong = MathVerdict(True, [], "correct", extracted), MathVerdict(False, [], "wrong answer", extracted)
    kinds = {reference.kind, value.kind}
    if kinds == {"number"}:
        x, y = reference.value, value.value
        if x == y:
            return right
        apart = abs(x - y) > Fraction(2, 10**6) and max(abs(x), abs(y)) < 10**6  # more than rounding can join
        if not (reference.decimal or value.decimal) or apart:
            return wrong
        return None
    if kinds <= {"set", "number"}:  # a number is compared as a one-element set
        if reference.decimal or value.decimal:
            return None
        a, b = ({p.value} if p.kind == "number" else p.value for p in (reference, value))
        if boxed and reference.kind == "number" and len(b) > 1:
            return MathVerdict(False, [MULTIPLE_ANSWERS], "several alternatives in one answer", extracted)
        return right if a == b else wrong
    if len(kinds) == 1:
        return right if reference.value == value.value else wrong
    return None


def quick_verdict(answer: FinalAnswer, gold: str) -> MathVerdict | None:
    """The verdict without sympy where it is certain, else None (the worker decides).

    A stray boxed answer is a hedge whatever the reference. Otherwise both sides must be plain (``_Plain``):
    math-verify compares those exactly (two decimals after rounding to 6 places), so equal values are correct
    and different ones wrong; the rest (1/3 vs 0.3333333, a set vs an interval) goes to the worker.
    """
    if answer.stray:
        reason = f"different boxed answers: {answer.stray!r}, then {answer.text!r}"
        return MathVerdict(False, [MULTIPLE_ANSWERS], reason, answer.text)
    reference = _read_plain(gold) if "$" not in gold else None
    if reference is None:
        return None
    if reference.kind == "number":
        answer = replace(answer, text=decimal_commas(answer.text))
    if answer.boxed and reference.kind == "number":
        if answer.distinct > 1:
            return MathVerdict(False, [MULTIPLE_ANSWERS], f"{answer.distinct} different boxed answers", answer.text)
        if _ALTERNATIVES.search(answer.text):
            return MathVerdict(False, [MULTIPLE_ANSWERS], "several alternatives in one answer", answer.text)
    text = answer.text if answer.boxed else _stated_answer(answer.text)
    value = _read_plain(text) if text is not None else None
    return _plain_verdict(reference, value, text.strip(), answer.boxed) if value is not None else None


@lru_cache(maxsize=4096)
def _parse_reference(gold: str) -> tuple:
    """The reference parsed once per worker: a GRPO group's samples share it."""
    return tuple(parse(gold if "$" in gold else f"${gold}$", parsing_timeout=None))


def _single_value(value: Any) -> bool:
    """True when the reference is one value (``3``, ``x = 3``): only then is an answer with several values a hedge.

    Sets, tuples, intervals, matrices, inequalities and assignments of those (``a = 4, -8, -10``) hold several.
    """
    if isinstance(value, sympy.Eq):
        value = value.rhs
    return isinstance(value, sympy.Expr) and not isinstance(value, (sympy.MatrixBase, MatrixExpr))


def _dropped_tail(content: str) -> str:
    """What math-verify's unit removal cut from the end of a boxed answer (``\\text{ cm}`` of ``5\\text{ cm}``).

    Normalised with and without unit removal, which only ever cuts a tail, the rest being the same steps.
    """
    box = f"\\boxed{{{content}}}"
    full, kept = normalize_latex(box, _BASIC_LATEX), normalize_latex(box, _WITH_UNITS)
    return full[len(kept) :] if full.startswith(kept) else ""


def _partial(content: str) -> bool:
    """True when the parser dropped numbers or math from the answer, not just a unit."""
    return bool(_JUXTAPOSED.search(content)) or not _UNIT_TAIL.fullmatch(_SPACE.sub("", _dropped_tail(content)))


def _scalar(value: Any) -> Any:
    """The numeric scalar a value stands for (an assignment's right side), else None: only scalars are re-checked.

    An equation that assigns nothing (``10x + 32y = -124``) is no scalar: a rescaled one has another right side.
    """
    if isinstance(value, sympy.Eq):
        if not isinstance(value.lhs, sympy.Symbol):
            return None
        value = value.rhs
    if isinstance(value, sympy.Expr) and not isinstance(value, (sympy.MatrixBase, MatrixExpr)) and value.is_number:
        return value
    return None


def _close(a: Any, b: Any, rel_tol: float) -> bool:
    """Equal to a relative tolerance, or a decimal answer of 3+ significant digits that rounds to the reference."""
    x, y = sympy.N(a, 30), sympy.N(b, 30)
    if not (x.is_number and y.is_number):
        return True  # not numeric: nothing to re-check
    diff = abs(x - y)
    if diff == 0 or diff <= rel_tol * max(abs(x), abs(y)):
        return True
    written_decimal = a.has(sympy.Float) or b.has(sympy.Float)
    return bool(written_decimal and min(abs(x), abs(y)) >= 1e-4)


def _tolerance_ok(reference: Any, answer: Any, rel_tol: float) -> bool:
    """False when only math-verify's rounding (or chop) made two numbers equal.

    A percentage is read both ways, as math-verify reads it (50% equals 50 and 0.5). Anything sympy cannot
    evaluate here (a matrix product recursed without end in ``sympy.N``) keeps math-verify's verdict.
    """
    try:
        x, y = _scalar(reference), _scalar(answer)
        if x is None or y is None:
            return True
        readings = [(a, b) for a in {x, get_pct_val(x, x)} for b in {y, get_pct_val(y, y)}]
        return any(_close(a, b, rel_tol) for a, b in readings)
    except Exception:  # RecursionError included: sympy's failure, not the answer's
        return True


def _sympy_verdict(answer: FinalAnswer, gold: str, rel_tol: float) -> MathVerdict:
    """Worker side, after :func:`quick_verdict` returned None: math-verify's parse and verify, then the guards.

    No timeouts inside: the caller holds the deadline.
    """
    reference = _parse_reference(gold)
    if not reference:
        return MathVerdict(False, [NO_ANSWER], f"reference {gold!r} does not parse")
    single = _single_value(reference[0])
    if single:
        answer = replace(answer, text=decimal_commas(answer.text))
    if answer.boxed and single and answer.distinct > 1:
        return MathVerdict(False, [MULTIPLE_ANSWERS], f"{answer.distinct} different boxed answers", answer.text)
    text = f"\\boxed{{{braced_variable_tail(answer.text)}}}" if answer.boxed else sentence_stops(answer.text)
    pred = parse(text, parsing_timeout=None)
    if not pred:
        return MathVerdict(False, [NO_ANSWER], "no parsable answer")
    matched = pred[-1] if isinstance(pred[-1], str) else ""
    if answer.boxed:
        several = isinstance(pred[0], sympy.FiniteSet) and len(pred[0]) > 1
        if single and (several or _ALTERNATIVES.search(answer.text)):
            return MathVerdict(False, [MULTIPLE_ANSWERS], "several alternatives in one answer", answer.text)
        if _partial(answer.text):
            return MathVerdict(
                False, [PARTIAL_PARSE], f"answer {answer.text!r} only partly parsed as {matched!r}", answer.text
            )
    if not verify(list(reference), pred, timeout_seconds=None):
        restated = restatements(reference[0], pred[0])
        if restated is None or not verify([restated[0]], [restated[1]], timeout_seconds=None):
            return MathVerdict(False, [], "wrong answer", matched)
        return MathVerdict(True, [], "correct, restated", matched)
    if not _tolerance_ok(reference[0], pred[0], rel_tol):
        reason = f"{matched!r} equals {gold!r} only after rounding"
        return MathVerdict(False, [TOLERANCE_FALSE_POSITIVE], reason, matched)
    return MathVerdict(True, [], "correct", matched)


def check_answer(completion: str, gold: str, rel_tol: float = 1e-6) -> MathVerdict:
    """The whole check in this process, without a deadline (tests; callers that hold their own deadline)."""
    answer = find_answer(completion)
    return quick_verdict(answer, gold) or _sympy_verdict(answer, gold, rel_tol)


class MathVerifier:
    """Thread-safe front of the check: plain answers in process, the rest in deadline workers, verdicts cached."""

    def __init__(self, timeout_s: float = 5.0, workers: int = 1, rel_tol: float = 1e-6, cache_size: int = 4096) -> None:
        self.rel_tol = rel_tol
        self.cache_size = cache_size
        self._caller = DeadlineCaller(_sympy_verdict, workers=workers, timeout_s=timeout_s)
        self._cache: OrderedDict[tuple[FinalAnswer, str], MathVerdict] = OrderedDict()
        self._lock = threading.Lock()

    def verify(self, completion: str, gold: Any) -> MathVerdict:
        answer, gold = find_answer(completion), str(gold)
        verdict = quick_verdict(answer, gold)
        if verdict is not None:
            return verdict
        key = (answer, gold) if answer.boxed else None  # an unboxed key is a whole completion: it never repeats
        if key is not None:
            with self._lock:
                verdict = self._cache.get(key)
                if verdict is not None:
                    self._cache.move_to_end(key)
        if verdict is None:
            try:
                verdict = self._caller.call(answer, gold, self.rel_tol)
            except (
                TimeoutError
            ) as exc:  # not cached: under load a right answer may time out once and must not stay wrong
                return MathVerdict(False, [TIMEOUT], str(exc))
            except RuntimeError as exc:  # a dead or unstartable worker says nothing about the answer: not cached
                return MathVerdict(False, [ERROR], str(exc))
            if key is not None:
                with self._lock:
                    self._cache[key] = verdict
                    if len(self._cache) > self.cache_size:
                        self._cache.popitem(last=False)
        return replace(verdict, flags=list(verdict.flags))

    def close(self) -> None:
        self._caller.close()


class MathReward:
    """Reward function: 1.0 for a verified answer to ``sample.answer``, else 0.0 (flags explain why).

    ``answer_tag`` (e.g. ``"answer"``) verifies only the content of the last ``<answer>...</answer>``
    and scores a completion without one 0: otherwise math-verify reads the last number anywhere in
    the text, and a policy that sprays digits gets paid for the right one by chance.
    """

    def __init__(
        self, timeout_s: float = 5.0, workers: int = 1, rel_tol: float = 1e-6, answer_tag: str | None = None
    ) -> None:
        self.verifier = MathVerifier(timeout_s=timeout_s, workers=workers, rel_tol=rel_tol)
        tag = re.escape(answer_tag) if answer_tag else None
        self.tag_pattern = re.compile(rf"<{tag}>(.*?)</{tag}>", re.DOTALL) if tag else None

    def __call__(self, sample: Scorable) -> RewardValue:
        if sample.answer is None:
            return RewardValue(0.0, [NO_ANSWER], info={"reason": "sample has no reference answer"})
        text = sample.completion_text
        if self.tag_pattern is not None:
            tagged = self.tag_pattern.findall(text)
            if not tagged:
                return RewardValue(0.0, [NO_ANSWER], info={"reason": "no answer inside the required tags"})
            text = tagged[-1]
        verdict = self.verifier.verify(text, sample.answer)
        metrics = {"math/timeout": float(TIMEOUT in verdict.flags)}
        return RewardValue(float(verdict.correct), verdict.flags, metrics, {"reason": verdict.reason})

    def close(self) -> None:
        self.verifier.close()
