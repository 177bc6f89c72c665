"""Generate the math-answer agreement corpus: gold answers from shipped datasets, predictions in the forms models write.

Why it exists: a verifier measured on pairs drawn by its own author's generator agrees with whatever that
author thought of (issue 37). This corpus starts from gold answers that ship in installed packages:
reasoning-gym's math tasks (arithmetic, decimals, fractions, dice and coin odds, complex numbers, polynomial
roots and products, integrals, triangle centres with exact coordinates, GSM-style word problems with their
worked solutions) and math-verify's own MATH few-shot answers. Each gold answer is rewritten into the
forms a policy writes (LaTeX and plain, boxed or stated, units and currency, thousands and decimal commas,
rounded decimals, intervals as inequalities, matrices, equations rescaled or solved, functions under
another variable name, long worked answers that end in the result) and into wrong forms of the same
shape. The generator decides each expected verdict from what it did to the gold answer, never by asking
a verifier.

Conventions the expected verdicts follow (docs/rewards.md lists them):

* a decimal equals an exact value when it is that value rounded to 6 decimals or more (math-verify's
  convention: ``0.333333`` is 1/3); a coarser rounding (``0.33`` for 1/3) is wrong, since the reference is
  exact and the policy could have given it;
* ``1,22`` is a decimal comma (1.22) when the digits after the comma are not three; ``1,234`` groups thousands;
* an equation is right when it has the same solutions: rescaled by a nonzero constant, its sides swapped,
  or solved for a variable;
* ``f(t) = t^2 + 1`` defines the same function as ``f(x) = x^2 + 1``;
* ``-2 \\le x \\le 7`` and ``x \\in [-2, 7]`` state the interval ``[-2, 7]``;
* a worked answer is judged by its final result, not by numbers on the way;
* several different final answers for one value, and an empty or placeholder box, are wrong.

Run ``python tests/reward/data/math_corpus.py`` to rewrite ``math_corpus.jsonl`` beside it (deterministic: seeded, and
run under a fixed hash seed).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import reasoning_gym
import sympy
from math_verify.few_shots import GSM8K_FEW_SHOTS, MATH_HARD_FEW_SHOTS

OUT = Path(__file__).with_suffix(".jsonl")
PER_TASK = 12  # examples drawn from each reasoning-gym task: ~650 pairs, a few seconds to check


def rows(name: str, seed: int) -> list[dict]:
    """``PER_TASK`` entries of one reasoning-gym task (question, answer, metadata), seeded."""
    return list(reasoning_gym.create_dataset(name, size=PER_TASK, seed=seed))


def case(category: str, source: str, gold: str, prediction: str, expected: bool, form: str) -> dict:
    return {
        "category": category,
        "source": source,
        "gold": gold,
        "prediction": prediction,
        "expected": expected,
        "form": form,
    }


def tex(value: Fraction) -> str:
    """An exact rational in LaTeX: ``-\\frac{2}{3}``, ``5``."""
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return rf"{sign}\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def decimal(value: Fraction, places: int) -> str:
    """``value`` rounded half-up to ``places`` decimals, trailing zeros kept (a rounding a model writes); an integer
    stays one."""
    if value.denominator == 1:
        return str(value.numerator)
    scaled = abs(value) * 10**places
    digits = str(int(scaled + Fraction(1, 2)))
    digits = digits.rjust(places + 1, "0")
    text = f"{digits[:-places]}.{digits[-places:]}" if places else digits
    return ("-" if value < 0 and float(text) != 0 else "") + text


def terminating(value: Fraction) -> bool:
    d = value.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d == 1


def thousands(n: int) -> str:
    return f"{n:,}"


# --- integers ----------------------------------------------------------------------------------------------


def integers() -> Iterator[dict]:
    """Integer answers: boxed, stated, with thousands commas, units or currency; wrong by one, hedged."""
    units = {"simple_geometry": (r"^\circ", " degrees"), "leg_counting": (r"\text{ legs}", " legs")}
    for name in ("basic_arithmetic", "chain_sum", "gcd", "lcm", "simple_equations", "simple_geometry", "leg_counting"):
        for i, row in enumerate(rows(name, seed=11)[: PER_TASK // 2]):
            gold = row["answer"].strip()
            n = int(gold)
            src = f"reasoning_gym:{name}:{i}"
            yield case("integer", src, gold, rf"The answer is $\boxed{{{n}}}$.", True, "boxed")
            yield case("integer", src, gold, f"Answer: {n}", True, "stated plain")
            if abs(n) >= 1000:
                yield case("integer", src, gold, rf"\boxed{{{thousands(n)}}}", True, "thousands commas")
            if name in units:
                latex_unit, plain_unit = units[name]
                yield case("unit", src, gold, rf"\boxed{{{n}{latex_unit}}}", True, "latex unit")
                yield case("unit", src, gold, f"The answer is {n}{plain_unit}.", True, "plain unit")
                yield case("unit", src, gold, rf"\boxed{{{n + 1}{latex_unit}}}", False, "wrong with unit")
            yield case("integer", src, gold, rf"\boxed{{{n + 1}}}", False, "off by one")
            if n != 0:
                yield case("integer", src, gold, rf"\boxed{{{-n}}}", False, "sign flipped")
            yield case("hedge", src, gold, rf"It is \boxed{{{n}}} or \boxed{{{n + 2}}}.", False, "two boxed answers")
            yield case("hedge", src, gold, rf"\boxed{{{n} \text{{ or }} {n - 3}}}", False, "alternatives in one box")


def word_problems() -> Iterator[dict]:
    """GSM-style problems with their worked solutions: the solution as a model writes it, currency, a wrong end."""
    for i, row in enumerate(rows("gsm_symbolic", seed=12)):
        gold = row["answer"].strip()
        n = int(gold)
        src = f"reasoning_gym:gsm_symbolic:{i}"
        cot = row["metadata"]["answer_cot"]
        body = cot.rsplit("####", 1)[0].strip()
        yield case("worked", src, gold, f"{body}\nThe answer is {n}.", True, "worked, stated")
        yield case("worked", src, gold, f"{body}\nSo the final answer is $\\boxed{{{n}}}$.", True, "worked, boxed")
        yield case("worked", src, gold, cot, True, "worked, #### marker")
        long_body = "\n".join([body] * 6)  # a long chain: the result appears many times before the end
        yield case("worked", src, gold, f"Let me check twice.\n{long_body}\nTherefore {n}.", True, "long worked")
        last_step = body.splitlines()[-1]
        checked = f"{body}\nThe answer is {n}.\nCheck: {last_step}"  # ends in a re-derivation, not a statement
        yield case("worked", src, gold, checked, True, "worked, check after")
        yield case(
            "worked", src, gold, f"{body}\nWait, I made a slip. The answer is {n + 5}.", False, "worked, wrong end"
        )
        yield case("unit", src, gold, rf"\boxed{{\${n}}}", True, "currency sign")
        yield case("unit", src, gold, f"The total is ${thousands(n)}.", True, "currency, plain")
    for j, shot in enumerate(GSM8K_FEW_SHOTS):
        final = shot["answer"].rsplit("The final answer is", 1)[1]
        value = re.sub(r"[^0-9.]", "", final.split("I hope")[0]).rstrip(".")
        src = f"math_verify:gsm8k_few_shot:{j}"
        yield case("worked", src, value, shot["answer"], True, "few-shot worked answer")
        body = shot["answer"].rsplit("The final answer is", 1)[0]
        wrong = str(Fraction(value) * 2).replace("/1", "")
        yield case("worked", src, value, f"{body}The final answer is {wrong}.", False, "few-shot, wrong end")


# --- decimals and fractions --------------------------------------------------------------------------------


def decimals() -> Iterator[dict]:
    """Decimal answers: exact, with a decimal comma, rounded to 6 places (right) or 2 (wrong)."""
    for name in ("decimal_arithmetic", "decimal_chain_sum", "coin_flip"):
        for i, row in enumerate(rows(name, seed=13)):
            gold = row["answer"].strip()
            value = Fraction(gold)
            src = f"reasoning_gym:{name}:{i}"
            places = len(gold.split(".")[1]) if "." in gold else 0
            plain = gold.rstrip("0").rstrip(".") if "." in gold else gold
            yield case("decimal", src, gold, rf"\boxed{{{plain}}}", True, "exact")
            if "." in plain and len(plain.split(".")[1]) != 3:
                comma = plain.replace(".", ",")
                yield case("decimal_comma", src, gold, rf"\boxed{{{comma}}}", True, "decimal comma")
                yield case("decimal_comma", src, gold, f"Das Ergebnis ist {comma}.", True, "decimal comma, plain")
                bumped = decimal(value + Fraction(1, 100), len(plain.split(".")[1]))  # wrong in the 2nd place
                yield case("decimal_comma", src, gold, rf"\boxed{{{bumped.replace('.', ',')}}}", False, "wrong comma")
            if places > 6:
                yield case("approximation", src, gold, rf"\boxed{{{decimal(value, 6)}}}", True, "6 places")
                yield case("approximation", src, gold, rf"\boxed{{\approx {decimal(value, 6)}}}", True, "approx sign")
            if places > 2 and decimal(value, 2) != plain:
                yield case("approximation", src, gold, rf"\boxed{{{decimal(value, 2)}}}", False, "2 places")
            yield case(
                "decimal", src, gold, rf"\boxed{{{decimal(value + Fraction(1, 10), max(places, 1))}}}", False, "+0.1"
            )


def fractions() -> Iterator[dict]:
    """Rational answers (simplified fractions, dice odds, coin odds as fractions): LaTeX, plain, decimal."""
    sources = []
    for i, row in enumerate(rows("fraction_simplification", seed=14)):
        meta = row["metadata"]
        value = Fraction(int(meta["simplified_numerator"]), int(meta["simplified_denominator"]))
        sources.append((f"reasoning_gym:fraction_simplification:{i}", row["answer"].strip("$ "), value))
    for i, row in enumerate(rows("dice", seed=15)):
        sources.append((f"reasoning_gym:dice:{i}", row["answer"].strip(), Fraction(row["answer"].strip())))
    for src, gold, value in sources:
        if value.denominator == 1:
            continue
        num, den = value.numerator, value.denominator
        yield case("fraction", src, gold, rf"\boxed{{\frac{{{num}}}{{{den}}}}}", True, "frac")
        yield case("fraction", src, gold, rf"$\boxed{{\dfrac{{{num}}}{{{den}}}}}$", True, "dfrac")
        yield case("fraction", src, gold, f"The probability is {num}/{den}.", True, "plain slash")
        yield case("fraction", src, gold, rf"\boxed{{\frac{{{3 * num}}}{{{3 * den}}}}}", True, "unreduced")
        if terminating(value):
            exact = str(float(value))
            yield case("fraction", src, gold, rf"\boxed{{{exact}}}", True, "terminating decimal")
        else:
            yield case("approximation", src, gold, rf"\boxed{{{decimal(value, 6)}}}", True, "6 places")
            yield case("approximation", src, gold, rf"\boxed{{{decimal(value, 2)}}}", False, "2 places")
        yield case("fraction", src, gold, rf"\boxed{{\frac{{{den}}}{{{num}}}}}", False, "reciprocal")
        yield case("fraction", src, gold, rf"\boxed{{\frac{{{num + 1}}}{{{den}}}}}", False, "numerator + 1")


def few_shot_math() -> Iterator[dict]:
    """math-verify's MATH few-shot answers (an interval, integers, a negative fraction) in other forms."""
    golds = {}
    for j, shot in enumerate(MATH_HARD_FEW_SHOTS):
        golds[j] = shot["answer"].rsplit("The final answer is $", 1)[1].split("$")[0]
    for j, gold in golds.items():
        src = f"math_verify:math_few_shot:{j}"
        yield case("worked", src, gold, MATH_HARD_FEW_SHOTS[j]["answer"], True, "few-shot worked answer")
    # the interval [2,5) (domain of sqrt(x-2)/sqrt(5-x))
    yield case(
        "inequality_interval", "math_verify:math_few_shot:0", "[2,5)", r"\boxed{2 \le x < 5}", True, "inequality"
    )
    yield case("interval", "math_verify:math_few_shot:0", "[2,5)", r"\boxed{x \in [2, 5)}", True, "x in")
    yield case("interval", "math_verify:math_few_shot:0", "[2,5)", r"\boxed{[2,5]}", False, "closed end")
    yield case("inequality_interval", "math_verify:math_few_shot:0", "[2,5)", r"\boxed{2 < x < 5}", False, "open start")
    neg = "math_verify:math_few_shot:3"
    yield case("fraction", neg, r"-\frac{2}{3}", r"\boxed{-2/3}", True, "plain slash")
    yield case("approximation", neg, r"-\frac{2}{3}", r"\boxed{-0.666667}", True, "6 places")
    yield case("approximation", neg, r"-\frac{2}{3}", r"\boxed{-0.67}", False, "2 places")
    yield case("fraction", neg, r"-\frac{2}{3}", r"\boxed{\frac{2}{3}}", False, "sign")


# --- structured answers ------------------------------------------------------------------------------------


def gaussian(a: int, b: int) -> str:
    """``a + bi`` as a model writes it: ``3 - 2i``, ``6i``, ``12``."""
    if b == 0:
        return str(a)
    imag = f"{'' if abs(b) == 1 else abs(b)}i"
    if a == 0:
        return f"-{imag}" if b < 0 else imag
    return f"{a} {'-' if b < 0 else '+'} {imag}"


def complex_numbers() -> Iterator[dict]:
    for i, row in enumerate(rows("complex_arithmetic", seed=16)):
        gold = row["answer"].strip()
        re_part, im_part = (int(v) for v in row["metadata"]["result"])
        src = f"reasoning_gym:complex_arithmetic:{i}"
        yield case("complex", src, gold, rf"\boxed{{{gaussian(re_part, im_part)}}}", True, "a + bi")
        yield case("complex", src, gold, rf"\boxed{{{gaussian(re_part, -im_part)}}}", im_part == 0, "conjugate")


def roots() -> Iterator[dict]:
    """Polynomial roots (a set of decimals): reordered, as equations, one missing."""
    for i, row in enumerate(rows("polynomial_equations", seed=17)):
        gold = row["answer"].strip()
        if not gold:
            continue
        values = [v.strip() for v in gold.split(",")]
        var = row["metadata"]["variable"]
        src = f"reasoning_gym:polynomial_equations:{i}"
        clean = [v[:-2] if v.endswith(".0") else v for v in values]
        yield case("roots", src, gold, rf"\boxed{{{', '.join(reversed(clean))}}}", True, "reordered")
        yield case("roots", src, gold, rf"\boxed{{{', '.join(f'{var} = {v}' for v in clean)}}}", True, "as equations")
        if len(values) > 1:
            yield case("roots", src, gold, rf"\boxed{{{', '.join(clean[1:])}}}", False, "one root missing")
        bumped = [str(Fraction(clean[0]) + 1).replace("/1", "")] + clean[1:]
        yield case("roots", src, gold, rf"\boxed{{{', '.join(bumped)}}}", False, "one root wrong")


def expressions() -> Iterator[dict]:
    """Polynomial products and antiderivatives (sympy syntax gold): LaTeX, factored, a term changed."""
    for name in ("polynomial_multiplication", "simple_integration"):
        for i, row in enumerate(rows(name, seed=18)):
            src = f"reasoning_gym:{name}:{i}"
            expr = sympy.sympify(row["answer"].strip())
            gold = sympy.latex(expr)  # the dataset's sympy syntax (x**2) is no LaTeX: a recipe would convert it
            yield case("expression", src, gold, rf"\boxed{{{sympy.latex(expr)}}}", True, "latex")
            factored = sympy.factor(expr)
            if factored != expr:
                yield case("expression", src, gold, rf"\boxed{{{sympy.latex(factored)}}}", True, "factored")
            x = sorted(expr.free_symbols - {sympy.Symbol("C")}, key=str)[0]
            yield case("expression", src, gold, rf"\boxed{{{sympy.latex(expr + x)}}}", False, "extra term")
            if name == "polynomial_multiplication":
                t = sympy.Symbol("t")
                body = sympy.latex(expr)
                renamed = sympy.latex(expr.subs(x, t))
                fgold = f"f({x}) = {body}"
                yield case("function", src, fgold, rf"\boxed{{f(t) = {renamed}}}", True, "renamed variable")
                yield case("function", src, fgold, rf"\boxed{{f({x}) = {body}}}", True, "same")
                wrong = sympy.latex((expr + 1).subs(x, t))
                yield case("function", src, fgold, rf"\boxed{{f(t) = {wrong}}}", False, "renamed, wrong")


def points() -> Iterator[dict]:
    """Triangle centres with exact coordinates: exact, rounded to 6 (right) or 2 (wrong) places, swapped."""
    centres = [r for r in reasoning_gym.create_dataset("advanced_geometry", size=6 * PER_TASK, seed=19)]
    for i, row in enumerate(row for row in centres if "ortho" in row["metadata"]):
        coords = [Fraction(c) for c in row["metadata"]["ortho"]]
        gold = "(" + ", ".join(tex(c) for c in coords) + ")"
        src = f"reasoning_gym:advanced_geometry:{i}"
        yield case("tuple", src, gold, rf"\boxed{{({', '.join(str(c) for c in coords)})}}", True, "plain fractions")
        yield case(
            "approximation", src, gold, rf"\boxed{{({', '.join(decimal(c, 6) for c in coords)})}}", True, "6 places"
        )
        if any(not terminating(c) for c in coords):
            two = ", ".join(decimal(c, 2) for c in coords)
            yield case("approximation", src, gold, rf"\boxed{{({two})}}", False, "2 places")
        if coords[0] != coords[1]:
            yield case("tuple", src, gold, rf"\boxed{{({tex(coords[1])}, {tex(coords[0])})}}", False, "swapped")


def lines() -> Iterator[dict]:
    """The line through two of a triangle's vertices as ``a x + b y = c``: rescaled, swapped, solved, shifted."""
    for i, row in enumerate(rows("advanced_geometry", seed=20)):
        meta = row["metadata"]
        (x1, y1), (x2, y2) = (tuple(int(v) for v in meta[k]) for k in ("A", "B"))
        a, b = y2 - y1, x1 - x2
        if a == 0 or b == 0:
            continue
        c = a * x1 + b * y1
        g = sympy.igcd(sympy.igcd(a, b), c) or 1
        if a < 0:
            g = -g
        a, b, c = a // g, b // g, c // g
        x, y = sympy.symbols("x y")
        lhs = a * x + b * y
        gold = f"{sympy.latex(lhs)} = {c}"
        src = f"reasoning_gym:advanced_geometry:{i}"
        k = [2, 3, -1, -4][i % 4]
        yield case("equation", src, gold, rf"\boxed{{{sympy.latex(k * lhs)} = {k * c}}}", True, f"rescaled by {k}")
        yield case("equation", src, gold, rf"\boxed{{{c} = {sympy.latex(lhs)}}}", True, "sides swapped")
        slope = sympy.Rational(-a, b)
        yield case(
            "equation",
            src,
            gold,
            rf"\boxed{{y = {sympy.latex(slope * x + sympy.Rational(c, b))}}}",
            True,
            "solved for y",
        )
        yield case("equation", src, gold, rf"\boxed{{{sympy.latex(lhs)} = {c + 1}}}", False, "shifted")
        yield case("equation", src, gold, rf"\boxed{{{sympy.latex(a * x - b * y)} = {c}}}", False, "sign of y")


def intervals() -> Iterator[dict]:
    """Intervals between two exact values from the datasets (fractions of dice odds): as inequalities, ``x \\in``,
    with rounded endpoints."""
    values = [Fraction(r["answer"].strip()) for r in rows("dice", seed=21)]
    ints = [int(r["answer"]) for r in rows("basic_arithmetic", seed=21)]
    for i, (p, n) in enumerate(zip(values, ints)):
        lo, hi = sorted((Fraction(-abs(n)) - 1, p))
        src = f"reasoning_gym:dice+basic_arithmetic:{i}"
        closed = f"[{tex(lo)}, {tex(hi)}]"
        half = f"({tex(lo)}, {tex(hi)}]"
        yield case("interval", src, closed, rf"\boxed{{[{lo}, {hi}]}}", True, "plain endpoints")
        yield case("interval", src, closed, rf"\boxed{{x \in {closed}}}", True, "x in")
        yield case("interval", src, f"x \\in {closed}", rf"\boxed{{{closed}}}", True, "gold with x in")
        yield case("inequality_interval", src, closed, rf"\boxed{{{tex(lo)} \le x \le {tex(hi)}}}", True, "le le")
        yield case("inequality_interval", src, closed, rf"\boxed{{{tex(lo)} \leq x \leq {tex(hi)}}}", True, "leq")
        yield case("inequality_interval", src, half, rf"\boxed{{{tex(lo)} < x \le {tex(hi)}}}", True, "lt le")
        yield case("inequality_interval", src, closed, rf"\boxed{{{tex(lo)} < x \le {tex(hi)}}}", False, "open start")
        yield case("interval", src, closed, rf"\boxed{{{half}}}", False, "open start")
        if not terminating(hi):
            six = f"[{tex(lo)}, {decimal(hi, 6)}]"
            yield case("approximation", src, closed, rf"\boxed{{{six}}}", True, "interval, 6 places")
            two = f"[{tex(lo)}, {decimal(hi, 2)}]"
            yield case("approximation", src, closed, rf"\boxed{{{two}}}", False, "interval, 2 places")


def matrices() -> Iterator[dict]:
    """2x2 matrices of fractions from the datasets: pmatrix/bmatrix, rounded entries, transposed."""
    fr = [Fraction(r["answer"].strip()) for r in rows("dice", seed=22)]
    ints = [int(r["answer"]) for r in rows("gcd", seed=22)]
    for i in range(PER_TASK - 1):
        entries = [fr[i], Fraction(ints[i]), Fraction(-ints[i + 1]), fr[i + 1]]
        src = f"reasoning_gym:dice+gcd:{i}"

        def mat(cells: list[str], env: str = "pmatrix") -> str:
            return rf"\begin{{{env}}} {cells[0]} & {cells[1]} \\ {cells[2]} & {cells[3]} \end{{{env}}}"

        gold = mat([tex(e) for e in entries])
        yield case("matrix", src, gold, rf"\boxed{{{mat([tex(e) for e in entries], 'bmatrix')}}}", True, "bmatrix")
        yield case("matrix", src, gold, rf"\boxed{{{mat([str(e) for e in entries])}}}", True, "slash fractions")
        yield case("approximation", src, gold, rf"\boxed{{{mat([decimal(e, 6) for e in entries])}}}", True, "6 places")
        if any(not terminating(e) for e in entries):
            yield case(
                "approximation", src, gold, rf"\boxed{{{mat([decimal(e, 2) for e in entries])}}}", False, "2 places"
            )
        if entries[1] != entries[2]:
            t = [entries[0], entries[2], entries[1], entries[3]]
            yield case("matrix", src, gold, rf"\boxed{{{mat([tex(e) for e in t])}}}", False, "transposed")


def placeholders() -> Iterator[dict]:
    for i, row in enumerate(rows("lcm", seed=23)[:4]):
        gold = row["answer"].strip()
        src = f"reasoning_gym:lcm:{i}"
        for text in (r"\boxed{}", r"\boxed{?}", r"\boxed{\text{answer}}", r"\boxed{x}"):
            yield case("placeholder", src, gold, f"The answer is {text}.", False, "placeholder")


GENERATORS = (
    integers,
    word_problems,
    decimals,
    fractions,
    few_shot_math,
    complex_numbers,
    roots,
    expressions,
    points,
    lines,
    intervals,
    matrices,
    placeholders,
)


def build() -> list[dict]:
    out = []
    for gen in GENERATORS:
        out.extend(gen())
    for n, item in enumerate(out):
        item["id"] = n
    return out


def main() -> None:
    if os.environ.get("PYTHONHASHSEED") != "0":  # reasoning-gym's polynomials come out of a set: fix its order
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"})
    corpus = build()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w") as f:
        for item in corpus:
            f.write(json.dumps(item, ensure_ascii=False) + "\n")
    cats: dict[str, list[int]] = {}
    for item in corpus:
        cats.setdefault(item["category"], [0, 0])[item["expected"]] += 1
    print(f"{len(corpus)} pairs -> {OUT}")
    for cat, (wrong, right) in sorted(cats.items()):
        print(f"  {cat:20s} {right:4d} right {wrong:4d} wrong")


if __name__ == "__main__":
    main()
