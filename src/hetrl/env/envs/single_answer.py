"""Single-turn math: one question, one answer, scored on the final answer."""

from __future__ import annotations

from hetrl.env.base import Environment, Message, StepResult, Task
from hetrl.env.scoring import Scorer, score_answer


class MathEnv(Environment):
    """The policy answers once; the episode ends with the scorer's reward (default: ``score_answer``).

    The reference answer also travels in ``Sample.answer``, so the reward workers' verifier can
    re-score the same text independently.
    """

    system_prompt = "Solve the problem. Think briefly, then give only the final answer inside <answer></answer> tags."

    def __init__(self, system_prompt: str | None = None, scorer: Scorer = score_answer) -> None:
        super().__init__(system_prompt)
        self.scorer = scorer
        self.task: Task | None = None

    async def reset(self, task: Task, seed: int) -> list[Message]:
        self.task = task
        return self.initial_messages(task)

    async def step(self, action: Message) -> StepResult:
        if self.task is None:
            raise RuntimeError("MathEnv.step before reset")
        return StepResult(observations=[], reward=self.scorer(action["content"], self.task), done=True)
