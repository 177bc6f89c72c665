"""Final-answer extraction and the default answer check of the math-style environments.

Environments score their episodes so that each can be tested end to end and used without a reward
worker; the reward area's verifier (math-verify) scores ``Sample.answer`` independently, so a
recipe can keep the env score as a signal or ignore it. The check is pluggable: environments take
any ``Scorer``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from hetrl.env.base import Task

Scorer = Callable[[str, Task], float]

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER_RE = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def extract_answer(text: str) -> str | None:
    """The final answer: the last ``<answer>..</answer>``, else the last ``\\boxed{}``, else None."""
    for pattern in (_ANSWER_RE, _BOXED_RE):
        found = pattern.findall(text)
        if found:
            return found[-1].strip()
    return None


def _as_number(text: str) -> float | None:
    match = _NUMBER_RE.fullmatch(text.strip().rstrip("."))
    return float(match.group(0).replace(",", "")) if match else None


def answers_match(given: str, reference: str) -> bool:
    """Numbers compare with a relative tolerance, everything else as whitespace/case-normalised text."""
    a, b = _as_number(given), _as_number(reference)
    if a is not None and b is not None:
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
    norm = lambda s: " ".join(s.lower().split())  # noqa: E731
    return norm(given) == norm(reference)


def score_answer(text: str, task: Task) -> float:
    """1.0 for a correct final answer, else 0.0 (partial credit where reasoning-gym gives it).

    reasoning-gym tasks use the dataset's own scorer (countdown accepts any expression that hits the
    target, not just the reference one).
    """
    given = extract_answer(text)
    if given is None:
        return 0.0
    rg = task.metadata.get("reasoning_gym")
    if rg is not None:
        import reasoning_gym

        return float(reasoning_gym.get_score_answer_fn(rg["name"])(given, rg["entry"]))
    return 1.0 if answers_match(given, str(task.answer)) else 0.0
