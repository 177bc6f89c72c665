"""Code rewards: the fraction of tests a policy-written program passes, run in the sandbox.

The verdict never comes from the program. For function-call tests only the ARGUMENTS enter the
sandbox; the harness (sandbox_harness.py, read-only inside) reports the values the candidate
returned, as plain data of exact builtin types, on a pipe; the host decodes them and compares them
with the expected values, which never left the host. Exit codes and stdout decide nothing. So
exiting early, patching the harness, an object whose ``__eq__`` is always true, printing "all
tests passed" or writing fake records can at best reproduce values the program already computes
-- and each attempt is named by a flag (hacking.py) that zeroes the sample. For stdin/stdout tests
each test is one sandboxed run whose stdout the host compares.

Test formats (``Sample.answer``): ``{"calls": [{"fn", "args", "expected", "tol"?}, ...]}``,
``{"io": [{"stdin", "stdout"}, ...]}``, or ``{"asserts": "<HumanEval check source>", "entry_point": name}``.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetrl.config.reward import SandboxConfig, SandboxLimits
from hetrl.reward.base import RewardValue, Scorable
from hetrl.reward.hacking import (
    CHANNEL_TAMPER,
    EARLY_EXIT,
    EQ_OVERRIDE,
    FAKE_PASS_OUTPUT,
    HARNESS_TAMPER,
    fake_pass_output,
    is_hack,
    scan_code,
)
from hetrl.sandbox import ExecutionResult, SandboxPool

HARNESS_SOURCE = Path(__file__).with_name("sandbox_harness.py").read_text()
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)
_EVENTS = {"start", "load_error", "result", "error", "untrusted_type", "exit", "done"}


@dataclass
class CallTest:
    fn: str
    args: list[Any]
    expected: Any
    tol: float | None = None


def extract_code(completion: str) -> str:
    """The last fenced Python block of a completion, else the completion itself."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def tests_from_asserts(source: str, entry_point: str) -> list[CallTest]:
    """HumanEval-style ``assert candidate(...) == literal`` (or ``abs(candidate(...) - x) < tol``) as call tests.

    Raises ValueError on an assert of another shape: such a test would have to run next to the
    candidate, where its expected value could be read and its verdict forged.
    """
    tests = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assert):
            continue
        test = node.test
        try:
            if (
                isinstance(test, ast.Compare)
                and len(test.ops) == 1
                and isinstance(test.ops[0], ast.Eq)
                and isinstance(test.left, ast.Call)
            ):
                tests.append(
                    CallTest(
                        entry_point,
                        [ast.literal_eval(a) for a in test.left.args],
                        ast.literal_eval(test.comparators[0]),
                    )
                )
                continue
            if (
                isinstance(test, ast.Compare)
                and isinstance(test.ops[0], ast.Lt)
                and isinstance(test.left, ast.Call)
                and getattr(test.left.func, "id", "") == "abs"
                and isinstance(test.left.args[0], ast.BinOp)
            ):
                diff = test.left.args[0]
                tests.append(
                    CallTest(
                        entry_point,
                        [ast.literal_eval(a) for a in diff.left.args],
                        ast.literal_eval(diff.right),
                        ast.literal_eval(test.comparators[0]),
                    )
                )
                continue
        except (ValueError, AttributeError, IndexError, TypeError):
            pass
        raise ValueError(f"unsupported assert shape: {ast.unparse(test)[:120]!r}")
    return tests


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if "__float__" in value:
            return float(value["__float__"])
        if "__seq__" in value:
            items = [_decode(v) for v in value["items"]]
            return tuple(items) if value["__seq__"] == "tuple" else items
        if "__dict__" in value:
            return {_freeze(_decode(k)): _decode(v) for k, v in value["__dict__"]}
        raise ValueError("unknown tagged value")
    if isinstance(value, list):
        raise ValueError("untagged list")
    return value


def _freeze(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


def _equal(actual: Any, expected: Any, tol: float | None) -> bool:
    if tol is not None:
        return (
            isinstance(actual, (int, float))
            and not isinstance(actual, bool)
            and math.isfinite(actual)
            and abs(actual - expected) < tol
        )
    if isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        return len(actual) == len(expected) and all(_equal(a, e, None) for a, e in zip(actual, expected))
    return (
        type(actual) is type(expected)
        and actual == expected
        or (isinstance(expected, float) and isinstance(actual, int) and actual == expected)
    )


def parse_channel(data: bytes, n: int) -> tuple[dict[int, Any], set[str], dict[str, Any]]:
    """Decode the harness's records: (values by test index, flags, facts). Any irregularity = tampering."""
    values: dict[int, Any] = {}
    flags: set[str] = set()
    facts: dict[str, Any] = {"done": False, "errors": 0}
    lines = data.decode(errors="replace").splitlines()
    for k, line in enumerate(lines):
        try:
            rec = json.loads(line)
            event = rec["event"]
            if (
                event not in _EVENTS
                or facts["done"]
                or (k == 0) != (event == "start")
                or (event == "start" and rec["n"] != n)
            ):
                raise ValueError(event)
            if event in ("result", "error", "untrusted_type"):
                i = rec["i"]
                if type(i) is not int or not 0 <= i < n or i in values:
                    raise ValueError("bad index")
                values[i] = _decode(rec["value"]) if event == "result" else _Missing
                flags.update({EQ_OVERRIDE} if event == "untrusted_type" else set())
                facts["errors"] += event == "error"
            elif event == "exit":
                flags.add(EARLY_EXIT)
            elif event == "done":
                facts["done"] = True
                if rec.get("planted"):
                    flags.add(HARNESS_TAMPER)
        except (ValueError, KeyError, TypeError, json.JSONDecodeError):
            flags.add(CHANNEL_TAMPER)
            break
    return values, flags, facts


class _Missing:
    """Marker for a test that produced no trustworthy value."""


class CodeReward:
    """Reward function: fraction of the sample's tests passed (0 on any hack flag)."""

    def __init__(
        self, sandbox_pool: SandboxPool | None = None, limits: dict[str, Any] | None = None, static_scan: bool = True
    ) -> None:
        """``sandbox_pool``: the rubric's pool, built from the recipe's ``reward.sandbox`` (see
        ``Rubric.from_config``); without one (direct use) a pool with the default settings is built
        here and closed by ``close``. ``limits`` overrides some of the pool's limits for this function."""
        self._owns_pool = sandbox_pool is None
        self._pool = sandbox_pool or SandboxPool(SandboxConfig())
        base = self._pool.config.limits
        self.limits = (
            SandboxLimits(**{**base.model_dump(), **limits}) if limits else base
        )  # unnamed ones stay the recipe's
        self.static_scan = static_scan

    def close(self) -> None:
        if self._owns_pool:
            self._pool.close()

    def __call__(self, sample: Scorable) -> RewardValue:
        code = extract_code(sample.completion_text)
        spec = sample.answer if isinstance(sample.answer, dict) else {}
        flags = set(scan_code(code)) if self.static_scan else set()
        if "io" in spec:
            passed, total, run_flags, info = self._run_io(code, spec["io"])
        elif "calls" in spec or "asserts" in spec:
            tests = (
                [CallTest(**t) for t in spec["calls"]]
                if "calls" in spec
                else tests_from_asserts(spec["asserts"], spec["entry_point"])
            )
            passed, total, run_flags, info = self._run_calls(code, tests)
        else:
            raise ValueError(
                f"sample {sample.sample_id}: code reward needs answer={{'calls'|'io'|'asserts': ...}}, got "
                f"{type(sample.answer).__name__}"
            )
        flags |= run_flags
        score = 0.0 if is_hack(sorted(flags)) or total == 0 else passed / total
        return RewardValue(
            score, sorted(flags), {"code/tests_passed": float(passed), "code/tests_total": float(total)}, info
        )

    def _run_calls(self, code: str, tests: list[CallTest]) -> tuple[int, int, set[str], dict]:
        inputs = json.dumps([{"fn": t.fn, "args": t.args} for t in tests])
        result = self._pool.run(
            argv=[self._pool.config.python, "-B", "-s", "harness.py"],
            files={"solution.py": code},
            ro_files={"harness.py": HARNESS_SOURCE, "inputs.json": inputs},
            limits=self.limits,
            channel=True,
        )
        values, flags, facts = parse_channel(result.channel, len(tests))
        if (
            not facts["done"]
            and not (result.timeout or result.memory_exceeded or result.output_truncated)
            and CHANNEL_TAMPER not in flags
        ):
            flags.add(EARLY_EXIT)  # the process ended cleanly but the harness never finished
        if fake_pass_output(result.stdout + result.stderr):
            flags.add(FAKE_PASS_OUTPUT)
        passed = sum(
            1
            for i, t in enumerate(tests)
            if i in values and values[i] is not _Missing and _equal(values[i], t.expected, t.tol)
        )
        return passed, len(tests), flags, {"reason": result.reason, "errors": facts["errors"]}

    def _run_io(self, code: str, tests: list[dict[str, str]]) -> tuple[int, int, set[str], dict]:
        jobs = [{"code": code, "stdin": t.get("stdin", ""), "limits": self.limits} for t in tests]
        results: list[ExecutionResult] = self._pool.map(jobs)
        flags: set[str] = set()
        passed = 0
        for t, r in zip(tests, results):
            if r.stdout.split() == t["stdout"].split() and not r.timeout and not r.output_truncated:
                passed += 1
            elif fake_pass_output(r.stdout):
                flags.add(FAKE_PASS_OUTPUT)
        return passed, len(tests), flags, {"reasons": sorted({r.reason for r in results})}
