"""Procedural tasks from reasoning-gym: offline, seeded, with the dataset's own scorer."""

from __future__ import annotations

import json
from typing import Any

from hetrl.env.base import Task

ANSWER_FORMAT = "Give your final answer inside <answer></answer> tags."


class ReasoningGymSource:
    """``size`` tasks of reasoning-gym dataset ``name``, fixed by ``seed`` (built lazily, per index).

    Each task keeps its reasoning-gym entry in ``metadata["reasoning_gym"]`` (JSON-safe) so that the
    env and reward workers can call the dataset's scorer on it.
    """

    def __init__(
        self,
        name: str,
        size: int,
        seed: int,
        options: dict[str, Any] | None = None,
        answer_instruction: str | None = None,
    ) -> None:
        import reasoning_gym

        try:
            self._dataset = reasoning_gym.create_dataset(name, seed=seed, size=size, **(options or {}))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"reasoning_gym dataset {name!r} with options {options}: {exc}") from exc
        self.name = f"reasoning_gym/{name}"
        self._rg_name = name
        self._size = size
        self._instruction = ANSWER_FORMAT if answer_instruction is None else answer_instruction

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index: int) -> Task:
        entry = self._dataset[index]
        entry = json.loads(json.dumps(entry, default=str))  # plain JSON: picklable and storable
        return Task(
            task_id=f"{self.name}/{index}",
            source=self.name,
            messages=[
                {
                    "role": "user",
                    "content": f"{entry['question']}\n\n{self._instruction}"
                    if self._instruction
                    else entry["question"],
                }
            ],
            answer=entry["answer"],
            metadata={"reasoning_gym": {"name": self._rg_name, "entry": entry}},
        )
