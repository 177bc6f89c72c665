"""Answer forms that state the reference but that math-verify refuses: read them as what they mean.

math-verify compares what it parsed, as parsed: ``1,22`` is the set {1, 22}, ``-2 \\le x \\le 7`` is a conjunction
of two inequalities (not the interval ``[-2, 7]``), and ``f(t) = t^2`` a different equation from ``f(x) = x^2``.
Policies write all three for a right answer (a decimal comma is the norm in much of the world's schooling), so
the verifier restates each before it gives up on an answer. Every restatement keeps the meaning exactly:

* a decimal comma is read only where the reference is one value, and only with other than three digits after it
  (``1,234`` stays a thousands separator: math-verify reads it so too);
* a chain of inequalities in one variable becomes its solution set (sympy's ``as_set``), compared with an
  interval or union reference, and the other way round;
* a function definition under another variable name, ``f(t) = ...``, is renamed to the reference's variables,
  unless a name it would take is already free in its body (``f(t) = t + x`` is not ``f(x) = 2x``);
* a trailing one-letter variable (``f(t) = 3t^2 - 2074 t``) is kept: math-verify's unit removal drops a
  letter that names a unit (t for tonnes, m for metres) after a number, and the term with it, which is both a false
  negative and a false positive (``3t^2 - 2074`` would match). It is kept where the letter is a variable elsewhere in
  the answer; ``5 m`` alone stays a unit;
* the full stop that ends a sentence after a number (``The probability is 7/20.``) is not a decimal point:
  math-verify reads ``7/20.`` as 7/20.0, a float quotient that no longer equals 7/20 exactly.

Measured on tests/reward/data/math_corpus.jsonl (docs/rewards.md has the figures).
"""

from __future__ import annotations

import re
from typing import Any

import sympy
from sympy.core.function import AppliedUndef
from sympy.core.relational import Relational

# One comma between digits, not three digits after it, no other comma or decimal point around: a decimal comma.
# A full stop after it ends a sentence ("... ist 3,75."), one between digits makes another number.
_DECIMAL_COMMA = re.compile(r"(?<![\d,])(?<!\d\.)(\d+)(?:,|\{,\})(\d{1,2}|\d{4,})(?![\d,]|\.\d|\{,\})")


_SENTENCE_STOP = re.compile(r"(?<=\d)\.(?=\s|$)")


def sentence_stops(text: str) -> str:
    """``text`` without the full stops that end a sentence right after a number (``is 7/20.`` -> ``is 7/20``)."""
    return _SENTENCE_STOP.sub("", text)


_TRAILING_LETTER = re.compile(r"(?<=[\s\d}])([A-Za-z])\s*$")


def braced_variable_tail(content: str) -> str:
    """``content`` with a trailing one-letter variable braced (``- 2074 t`` -> ``- 2074 {t}``), which math-verify's
    unit removal leaves alone, where the letter is a variable elsewhere in it (``f(t)``, ``t^{5}``)."""
    match = _TRAILING_LETTER.search(content)
    if match is None:
        return content
    rest = content[: match.start()]
    if re.search(rf"(?<![A-Za-z\\]){match[1]}(?![A-Za-z])", rest) is None:
        return content
    return f"{rest}{{{match[1]}}}"


def decimal_commas(text: str) -> str:
    """``text`` with decimal commas written as points (``3,75`` -> ``3.75``): call only for a one-value reference."""
    return _DECIMAL_COMMA.sub(r"\1.\2", text)


def _as_set(value: Any) -> Any:
    """The solution set of inequalities in one variable (``-2 <= x <= 7`` -> ``[-2, 7]``), else None."""
    if not isinstance(value, (Relational, sympy.And, sympy.Or)) or isinstance(value, (sympy.Eq, sympy.Ne)):
        return None
    if len(value.free_symbols) != 1:
        return None
    try:
        return value.as_set()
    except (NotImplementedError, TypeError, ValueError):  # sympy cannot solve it: no restatement
        return None


def _renamed(reference: Any, answer: Any) -> Any:
    """``f(t) = body`` renamed to the reference's ``f(x)``, or None when the two are not such definitions."""
    if not (isinstance(reference, sympy.Eq) and isinstance(answer, sympy.Eq)):
        return None
    ref_call, call = reference.lhs, answer.lhs
    if not (isinstance(ref_call, AppliedUndef) and isinstance(call, AppliedUndef)) or ref_call.func != call.func:
        return None
    ref_args, args = ref_call.args, call.args
    if len(ref_args) != len(args) or not all(isinstance(a, sympy.Symbol) for a in ref_args + args):
        return None
    if len(set(args)) != len(args) or answer.rhs.free_symbols & (set(ref_args) - set(args)):
        return None  # renaming would capture a name the body already uses
    return answer.subs(dict(zip(args, ref_args)), simultaneous=True)


def restatements(reference: Any, answer: Any) -> tuple[Any, Any] | None:
    """(reference, answer) restated to be comparable, or None when neither form applies."""
    renamed = _renamed(reference, answer)
    if renamed is not None:
        return reference, renamed
    ref_set, answer_set = _as_set(reference), _as_set(answer)
    if answer_set is not None and isinstance(reference, sympy.Set | sympy.Eq) and ref_set is None:
        target = reference.rhs if isinstance(reference, sympy.Eq) else reference  # "x \in [a, b]": Eq(x, [a, b])
        return (target, answer_set) if isinstance(target, sympy.Set) else None
    if ref_set is not None and isinstance(answer, sympy.Set):
        return ref_set, answer
    return None
