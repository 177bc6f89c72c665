"""Math answers checked with math-verify, under our own deadline, with guards for its false positives.

math-verify's timeouts use ``signal.alarm`` (main thread only), so both are disabled here and the
whole check runs in a ``DeadlineCaller`` worker process instead. Guards, each with a named flag:

* several different ``\\boxed{}`` answers, or alternatives inside one box ("5 or 7", a set where
  the reference is a single value): the policy is hedging -> ``hack/multiple_answers``, score 0;
* a box the parser read only a prefix of, a number with two decimal points (``2.5.3``, read as
  2.5*0.3), or numbers
  only juxtaposed by a space, which sympy multiplies or adds (``12345 6789``) ->
  ``math/partial_parse``, score 0;
* numeric tolerance: math-verify compares after rounding, so 1/2^99 "equals" 1/2^98; an accepted
  numeric pair must also agree to a RELATIVE tolerance -> otherwise ``math/tolerance_false_positive``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

import sympy
from math_verify import parse, verify

from hetrl.reward.base import RewardValue
from hetrl.reward.deadline import DeadlineCaller
from hetrl.reward.hacking import MULTIPLE_ANSWERS
from hetrl.types import Sample

# math-verify warns on every call that its (signal-based) timeouts are off: we hold the deadline.
logging.getLogger("math_verify").setLevel(logging.ERROR)

PARTIAL_PARSE = "math/partial_parse"
TOLERANCE_FALSE_POSITIVE = "math/tolerance_false_positive"
TIMEOUT = "math/timeout"
NO_ANSWER = "math/no_answer"

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_JUXTAPOSED = re.compile(r"\d\s+\d|\d\.\d+\.\d")  # "12 34" (sympy multiplies/adds), "2.5.3" (read as 2.5*0.3)
_ALTERNATIVES = re.compile(r"\bor\b|\\lor\b|\\vee\b")


@dataclass
class MathVerdict:
    correct: bool
    flags: list[str] = field(default_factory=list)
    reason: str = ""
    extracted: str = ""


def boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` in ``text`` (balanced braces; an unclosed box is dropped)."""
    out = []
    for match in _BOXED.finditer(text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                out.append(text[start:i].strip())
                break
    return out


def _partial(content: str, matched: str) -> bool:
    """True when the parser kept only a prefix of the boxed answer, or the answer is ambiguous."""
    c, m = re.sub(r"\s+", "", content), re.sub(r"\s+", "", matched)
    dropped = c[len(m):] if c.startswith(m) else ""
    return bool(_JUXTAPOSED.search(content) or re.search(r"[0-9A-Za-z]", dropped))


def _relative_close(a: Any, b: Any, rel_tol: float) -> bool:
    try:
        x, y = sympy.N(a, 50), sympy.N(b, 50)
        if not (x.is_number and y.is_number):
            return True  # not numeric: nothing to re-check
        diff = abs(x - y)
        return bool(diff == 0 or diff <= rel_tol * max(abs(x), abs(y)))
    except (TypeError, ValueError, AttributeError):
        return True


def check_answer(completion: str, gold: str, rel_tol: float = 1e-6) -> MathVerdict:
    """Worker-side check (no timeouts inside: the caller holds the deadline)."""
    boxes = boxed_contents(completion)
    if len({re.sub(r"\s+", "", b) for b in boxes}) > 1:
        return MathVerdict(False, [MULTIPLE_ANSWERS], f"{len(boxes)} different boxed answers", boxes[-1])
    answer_text = f"\\boxed{{{boxes[-1]}}}" if boxes else completion[-500:]
    gold_parsed = parse(gold if "$" in gold else f"${gold}$", parsing_timeout=None)
    pred = parse(answer_text, parsing_timeout=None)
    if not pred or not gold_parsed:
        return MathVerdict(False, [NO_ANSWER], "no parsable answer" if not pred else f"reference {gold!r} does not parse")
    matched = pred[-1] if isinstance(pred[-1], str) else str(pred[0])
    if boxes:
        content = boxes[-1]
        gold_is_set = isinstance(gold_parsed[0], sympy.FiniteSet)
        if not gold_is_set and (isinstance(pred[0], sympy.FiniteSet) or _ALTERNATIVES.search(content)):
            return MathVerdict(False, [MULTIPLE_ANSWERS], "several alternatives in one answer", content)
        if _partial(content, matched):
            return MathVerdict(False, [PARTIAL_PARSE], f"answer {content!r} only partly parsed as {matched!r}", content)
    if not verify(gold_parsed, pred, timeout_seconds=None):
        return MathVerdict(False, [], "wrong answer", matched)
    if not _relative_close(gold_parsed[0], pred[0], rel_tol):
        return MathVerdict(False, [TOLERANCE_FALSE_POSITIVE], f"{matched!r} equals {gold!r} only after rounding", matched)
    return MathVerdict(True, [], "correct", matched)


_INTEGER = re.compile(r"\s*(-?\d{1,100})\s*")


def integer_verdict(completion: str, gold: str) -> MathVerdict | None:
    """The verdict when answer and reference are both plain integers, else None.

    Compared exactly, in process: math-verify would parse both with sympy in a worker process and
    reach the same verdict ~100x slower, and arithmetic tasks (the embedded default's) are made of
    these. Anything else (signs of a formula, units, boxes, decimals) goes to :func:`check_answer`.
    """
    answer, reference = _INTEGER.fullmatch(completion), _INTEGER.fullmatch(gold)
    if answer is None or reference is None:
        return None
    if int(answer[1]) == int(reference[1]):
        return MathVerdict(True, [], "correct", answer[1])
    return MathVerdict(False, [], "wrong answer", answer[1])


class MathVerifier:
    """Thread-safe front of ``check_answer`` with a hard per-call deadline (plain integers are checked in process)."""

    def __init__(self, timeout_s: float = 5.0, workers: int = 1, rel_tol: float = 1e-6) -> None:
        self.rel_tol = rel_tol
        self._caller = DeadlineCaller(check_answer, workers=workers, timeout_s=timeout_s)

    def verify(self, completion: str, gold: Any) -> MathVerdict:
        verdict = integer_verdict(completion, str(gold))
        if verdict is not None:
            return verdict
        try:
            return self._caller.call(completion, str(gold), self.rel_tol)
        except TimeoutError as exc:
            return MathVerdict(False, [TIMEOUT], str(exc))
        except RuntimeError as exc:
            return MathVerdict(False, ["math/error"], str(exc))

    def close(self) -> None:
        self._caller.close()


class MathReward:
    """Reward function: 1.0 for a verified answer to ``sample.answer``, else 0.0 (flags explain why).

    ``answer_tag`` (e.g. ``"answer"``) verifies only the content of the last ``<answer>...</answer>``
    and scores a completion without one 0: otherwise math-verify reads the last number anywhere in
    the text, and a policy that sprays digits gets paid for the right one by chance.
    """

    def __init__(self, timeout_s: float = 5.0, workers: int = 1, rel_tol: float = 1e-6, answer_tag: str | None = None) -> None:
        self.verifier = MathVerifier(timeout_s=timeout_s, workers=workers, rel_tol=rel_tol)
        self.tag_pattern = re.compile(rf"<{re.escape(answer_tag)}>(.*?)</{re.escape(answer_tag)}>", re.DOTALL) if answer_tag else None

    def __call__(self, sample: Sample) -> RewardValue:
        if sample.answer is None:
            return RewardValue(0.0, [NO_ANSWER], info={"reason": "sample has no reference answer"})
        text = sample.completion_text
        if self.tag_pattern is not None:
            tagged = self.tag_pattern.findall(text)
            if not tagged:
                return RewardValue(0.0, [NO_ANSWER], info={"reason": "no answer inside the required tags"})
            text = tagged[-1]
        verdict = self.verifier.verify(text, sample.answer)
        return RewardValue(float(verdict.correct), verdict.flags, {"math/timeout": float(TIMEOUT in verdict.flags)}, {"reason": verdict.reason})

    def close(self) -> None:
        self.verifier.close()
