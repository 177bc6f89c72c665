"""Code: the policy writes a function, the task's tests run against it in the sandbox."""

from __future__ import annotations

import re

from hetrl.env.base import Environment, Message, StepResult, Task
from hetrl.env.execution import CodeRunner, describe_failure

_FENCE_RE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The last fenced code block, else the whole text (models sometimes answer with bare code)."""
    blocks = _FENCE_RE.findall(text)
    return blocks[-1] if blocks else text


def build_program(code: str, answer: dict) -> str:
    """Solution + tests (+ ``check(entry_point)`` for HumanEval-style tests).

    A completion that only continues the function body (no ``def entry_point``) gets the task's
    prompt (signature + docstring) in front, as HumanEval's own harness does.
    """
    entry = answer.get("entry_point")
    if entry and not re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
        code = answer.get("prompt", "") + code
    program = f"{code}\n\n{answer['tests']}\n"
    if entry and re.search(r"^def check\(", answer["tests"], re.MULTILINE):
        program += f"\ncheck({entry})\n"
    return program


class CodeEnv(Environment):
    """Reward 1.0 when every test passes. With ``max_attempts`` > 1 a failure is fed back and the
    policy may retry (the failing tests' error as a user message)."""

    system_prompt = "You are an expert Python programmer. Reply with your solution in a ```python``` code block."

    def __init__(self, runner: CodeRunner, system_prompt: str | None = None, max_attempts: int = 1) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        super().__init__(system_prompt)
        self.runner = runner
        self.max_attempts = max_attempts
        self.task: Task | None = None
        self.attempts = 0

    async def reset(self, task: Task, seed: int) -> list[Message]:
        if not isinstance(task.answer, dict) or "tests" not in task.answer:
            raise ValueError(f"task {task.task_id}: the code env needs tests (answer={{'tests': ...}})")
        self.task = task
        self.attempts = 0
        return self.initial_messages(task)

    async def step(self, action: Message) -> StepResult:
        if self.task is None:
            raise RuntimeError("CodeEnv.step before reset")
        self.attempts += 1
        program = build_program(extract_code(action.get("content") or ""), self.task.answer)
        result = await self.runner.run(program)
        info = {"tests_passed": result.success, "execution": result.reason, "attempts": self.attempts}
        if result.success or self.attempts >= self.max_attempts:
            return StepResult([], reward=1.0 if result.success else 0.0, done=True, info=info)
        feedback = f"Your code failed the tests:\n{describe_failure(result)}\nFix it and reply with the whole solution."
        return StepResult([{"role": "user", "content": feedback}], info=info)
