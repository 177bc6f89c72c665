"""Multi-turn tool use: the policy calls tools until it answers without a call.

``ToolEnv`` is the shared loop (parse calls -> run them -> tool observations); subclasses give the
tools and the final scoring. ``ToolMathEnv`` solves math with a calculator and a sandboxed python.
"""

from __future__ import annotations

import ast
import operator
from abc import abstractmethod
from collections.abc import Callable
from typing import Any

from hetrl.env.base import Environment, Message, StepResult, Task
from hetrl.env.execution import CodeRunner, describe_failure
from hetrl.env.scoring import Scorer, score_answer
from hetrl.env.tools import ToolRegistry, parse_tool_calls


class ToolEnv(Environment):
    """Each turn: tool calls (and malformed ones) become tool messages; a turn without calls ends it."""

    base_prompt = ""

    def __init__(self, tools: list[Callable[..., Any]], system_prompt: str | None = None) -> None:
        self.registry = ToolRegistry(tools)
        # The tool listing is always appended: a recipe's own system prompt must not hide the tools.
        super().__init__(f"{system_prompt or self.base_prompt}\n\n{self.registry.describe()}")
        self.task: Task | None = None
        self.num_tool_calls = 0
        self.num_tool_errors = 0

    async def reset(self, task: Task, seed: int) -> list[Message]:
        self.task = task
        self.num_tool_calls = self.num_tool_errors = 0
        return self.initial_messages(task)

    async def step(self, action: Message) -> StepResult:
        if self.task is None:
            raise RuntimeError(f"{type(self).__name__}.step before reset")
        parsed = parse_tool_calls(action)
        if not parsed:
            reward = await self.finish(action)
            return StepResult([], reward=reward, done=True, info=self._counts())
        observations, num_errors = await self.registry.execute(parsed)
        self.num_tool_calls += len(parsed.calls) + len(parsed.errors)
        self.num_tool_errors += num_errors
        return StepResult(observations, info=self._counts())

    def _counts(self) -> dict[str, int]:
        return {"num_tool_calls": self.num_tool_calls, "num_tool_errors": self.num_tool_errors}

    @abstractmethod
    async def finish(self, action: Message) -> float:
        """The episode's reward once the policy answers without a tool call."""


_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
MAX_EXPONENT = 1000  # 9**9**9 would hang the worker: big powers are refused


def evaluate_arithmetic(expression: str) -> float | int:
    """Evaluate + - * / // % ** on numbers without eval(); ValueError for anything else."""

    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent {right} is too large")
            return _OPERATORS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.operand))
        raise ValueError(f"unsupported syntax: {ast.dump(node)[:80]}")

    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from None
    return walk(tree.body)


class ToolMathEnv(ToolEnv):
    """Math with tools: ``calculator`` (in-process, safe) and ``python`` (sandboxed via the runner)."""

    base_prompt = (
        "Solve the problem. You may use tools; when you know the result, reply without a tool "
        "call and give the final answer inside <answer></answer> tags."
    )

    def __init__(self, runner: CodeRunner, system_prompt: str | None = None, scorer: Scorer = score_answer) -> None:
        self.runner = runner
        self.scorer = scorer
        super().__init__([self.calculator, self.python], system_prompt)

    @staticmethod
    async def calculator(expression: str) -> str:  # async: cheap enough to run on the loop, no thread hop
        """Evaluate an arithmetic expression with + - * / // % ** and parentheses.

        Args:
            expression: The expression, e.g. "(3 + 4) * 12".
        """
        return str(evaluate_arithmetic(expression))

    async def python(self, code: str) -> str:
        """Run a Python program in a sandbox and return what it prints.

        Args:
            code: A complete program; print the values you need.
        """
        result = await self.runner.run(code)
        return result.stdout if result.success else f"error: {describe_failure(result)}"

    async def finish(self, action: Message) -> float:
        return self.scorer(action.get("content") or "", self.task)
