"""Task sources (indexable collections of Tasks) and the seeded, resumable stream over them.

A source is anything with ``name``, ``__len__`` and ``__getitem__(i) -> Task``; it is deterministic
given its own construction arguments (procedural ones take a seed). ``TaskStream`` walks a source
in a seeded order, reshuffled per epoch, and hands out an episode seed with each task. Its whole
position is ``state_dict()`` — three integers — so a run resumed from a checkpoint continues with
exactly the tasks and seeds it would have seen.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import Any, Protocol

from hetrl.env.base import Task


class TaskSource(Protocol):
    """A source may also define ``content_of(task)`` (see ``ProceduralSource``) when its tasks' messages
    are not all the policy is shown."""

    name: str

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Task: ...


class TaskStream:
    """Endless seeded stream of ``(task, episode_seed)``; ``state_dict``/``load_state_dict`` resume it."""

    def __init__(self, source: TaskSource, seed: int, shuffle: bool = True) -> None:
        if len(source) == 0:
            raise ValueError(f"task source {source.name!r} has no tasks")
        self.source = source
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.source)))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    @property
    def cursor(self) -> int:
        """Tasks handed out so far (all epochs)."""
        return self.epoch * len(self.source) + self.position

    def episode_seed(self, cursor: int) -> int:
        """A seed per stream position, independent of the source's size and of process count."""
        return random.Random(f"{self.seed}:episode:{cursor}").getrandbits(31)

    def next(self) -> tuple[Task, int]:
        if self.position == len(self._order):
            self.epoch += 1
            self.position = 0
            self._order = self._epoch_order(self.epoch)
        seed = self.episode_seed(self.cursor)
        task = self.source[self._order[self.position]]
        self.position += 1
        return task, seed

    def at(self, cursor: int) -> tuple[Task, int]:
        """What :meth:`next` returned (or will return) at stream position ``cursor``; the stream stays put.

        A checkpoint can so name tasks by position (plain ints) instead of pickling them.
        """
        if cursor < 0:
            raise ValueError(f"stream cursor must be >= 0, got {cursor}")
        epoch, position = divmod(cursor, len(self.source))
        order = self._order if epoch == self.epoch else self._epoch_order(epoch)
        return self.source[order[position]], self.episode_seed(cursor)

    def take(self, count: int) -> list[tuple[Task, int]]:
        return [self.next() for _ in range(count)]

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position, "num_tasks": len(self.source)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a saved cursor; refuses a state saved for a different seed or source size."""
        if state.get("seed") != self.seed or state.get("num_tasks") != len(self.source):
            raise ValueError(
                f"task stream state was saved for seed={state.get('seed')} over {state.get('num_tasks')} tasks; "
                f"this stream has seed={self.seed} over {len(self.source)} tasks (changed task config?)"
            )
        if not 0 <= state["position"] <= len(self.source) or state["epoch"] < 0:
            raise ValueError(f"task stream state out of range: {state}")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._epoch_order(self.epoch)


class ProceduralSource(ABC):
    """``size`` generated tasks, task ``i`` a pure function of ``(seed, i)`` (no state, any order)."""

    name: str

    def __init__(self, size: int, seed: int) -> None:
        if size < 1:
            raise ValueError(f"{self.name}: size must be >= 1, got {size}")
        self.size = size
        self.seed = seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Task:
        if not 0 <= index < self.size:
            raise IndexError(f"{self.name}: task {index} out of range (size {self.size})")
        return self.make(random.Random(f"{self.seed}:{index}"), index)

    @abstractmethod
    def make(self, rng: random.Random, index: int) -> Task:
        """Task ``index``, drawing all randomness from ``rng``."""

    def content_of(self, task: Task) -> Any:
        """What tells two of its tasks apart, for the held-out split (``hetrl.env.tasks.split``).

        All of a generated task but its id: environments show the policy more than the messages
        (``shapes`` renders its scene from the metadata), and the messages alone would make
        different scenes under one question the same task.
        """
        return [task.messages, task.answer, task.metadata]
