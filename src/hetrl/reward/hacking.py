"""Reward-hacking defenses: named flags, a static scan of policy-written code, value sanitising.

Every defense raises a flag named here; the rubric scores any sample with a ``hack/`` flag 0, so
a hack can never pay even when one reward source was fooled. The code harness (code.py) never
trusts the program for its verdict (the comparison happens on the host); the static scan below
exists to NAME what an attempt tried, and to zero attempts that the comparison alone would let
score on an easier test set. Its patterns are deliberately broad: a false positive costs one
sample's reward, a false negative teaches the policy a hack.
"""

from __future__ import annotations

import ast
import math
import re

EARLY_EXIT = "hack/early_exit"  # exit()/os._exit() before the harness finished
EQ_OVERRIDE = "hack/eq_override"  # returns an object with its own __eq__ (always-true comparisons)
HARNESS_TAMPER = "hack/harness_tamper"  # monkeypatching/replacing the test harness (conftest.py, sys.modules, builtins)
FAKE_PASS_OUTPUT = "hack/fake_pass_output"  # printing "all tests passed" and the like
CHANNEL_TAMPER = "hack/reward_channel_tamper"  # writing to the tests or the reward channel
REFERENCE_ACCESS = "hack/reference_access"  # reaching for the reference solution/expected outputs
MULTIPLE_ANSWERS = "hack/multiple_answers"  # several final answers at once
JUDGE_INJECTION = "hack/judge_injection"  # instructions aimed at the judge inside the response
JUDGE_IMPERSONATION = "hack/judge_impersonation"  # a verdict, score tag or fence end shaped like the grader's own
NONFINITE_REWARD = "hack/nonfinite_reward"  # nan/inf from a reward source
OUT_OF_RANGE_REWARD = "hack/out_of_range_reward"  # a value outside its source's declared range

ALL_FLAGS = (
    EARLY_EXIT,
    EQ_OVERRIDE,
    HARNESS_TAMPER,
    FAKE_PASS_OUTPUT,
    CHANNEL_TAMPER,
    REFERENCE_ACCESS,
    MULTIPLE_ANSWERS,
    JUDGE_INJECTION,
    JUDGE_IMPERSONATION,
    NONFINITE_REWARD,
    OUT_OF_RANGE_REWARD,
)

_FAKE_PASS = re.compile(
    r"(all\s+)?tests?\s+(have\s+)?passed|\bpassed\s*:\s*\d+|\b\d+\s*/\s*\d+\s+passed|^ok$", re.I | re.M
)
_EXIT_CALLS = {"_exit", "exit", "quit", "abort", "kill", "killpg"}
_TAMPER_MODULES = {
    "pytest",
    "unittest",
    "conftest",
    "builtins",
    "ctypes",
    "gc",
    "inspect",
    "importlib",
    "sitecustomize",
    "atexit",
}
_TAMPER_ATTRS = {
    "modules",
    "settrace",
    "setprofile",
    "_getframe",
    "__builtins__",
    "__code__",
    "f_back",
    "f_globals",
    "excepthook",
}
_CHANNEL_STRINGS = (
    "hetrl_channel",
    "/proc/self/fd",
    "/dev/fd",
    "inputs.json",
    "harness",
    "conftest",
    "sitecustomize",
    ".pth",
)
_REFERENCE_STRINGS = ("reference", "canonical", "expected", "solution.", "answer_key", "ground_truth", "/proc/1/", "..")
_REFERENCE_CALLS = {"getenv", "environ", "listdir", "scandir", "walk", "glob"}


def scan_code(code: str) -> list[str]:
    """Flags for hack attempts visible in the source (AST-based; unparsable code gets none)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return []
    flags: set[str] = set()
    # A string that is a whole statement (a docstring) does nothing: words in it ("expected", "..") are no access.
    inert = {
        id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in ("__eq__", "__ne__", "__hash__", "__bool__"):
            flags.add(EQ_OVERRIDE)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            )
            if any(n.split(".")[0] in _TAMPER_MODULES for n in names):
                flags.add(HARNESS_TAMPER)
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in _EXIT_CALLS:
                flags.add(EARLY_EXIT)
            if name in _REFERENCE_CALLS:
                flags.add(REFERENCE_ACCESS)
            if name in ("__import__", "setattr", "exec", "eval", "compile", "globals"):
                flags.add(HARNESS_TAMPER)
        elif isinstance(node, ast.Attribute) and node.attr in _TAMPER_ATTRS | {"environ"}:
            flags.add(REFERENCE_ACCESS if node.attr == "environ" else HARNESS_TAMPER)
        elif isinstance(node, ast.Name) and node.id in ("__builtins__", "SystemExit"):
            flags.add(HARNESS_TAMPER if node.id == "__builtins__" else EARLY_EXIT)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inert:
            flags.update(_string_flags(node.value))
    return sorted(flags)


def _string_flags(text: str) -> set[str]:
    low = text.lower()
    flags = set()
    if any(s in low for s in _CHANNEL_STRINGS):
        flags.add(CHANNEL_TAMPER)
    if any(s in low for s in _REFERENCE_STRINGS):
        flags.add(REFERENCE_ACCESS)
    if _FAKE_PASS.search(text):
        flags.add(FAKE_PASS_OUTPUT)
    return flags


def fake_pass_output(stdout: str) -> bool:
    """True when a program's own output claims success (it never decides the verdict here)."""
    return bool(_FAKE_PASS.search(stdout))


def check_value(value: float, low: float | None = None, high: float | None = None) -> list[str]:
    """Flags for a reward value that is nan/inf or outside [low, high]."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return [NONFINITE_REWARD]
    if (low is not None and value < low) or (high is not None and value > high):
        return [OUT_OF_RANGE_REWARD]
    return []


def is_hack(flags: list[str]) -> bool:
    return any(f.startswith("hack/") for f in flags)
