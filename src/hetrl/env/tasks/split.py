"""The held-out split: the tasks evaluation uses, and a training source that never shows them.

Tasks are compared by content, never by index or id: a dataset file often holds one prompt in
several rows, and a procedural source generated under another seed repeats many of its questions,
so ids say nothing about whether training has seen an eval prompt. The content is the canonical
JSON of the task's messages (the prompt the policy is shown), or of what the source's
``content_of(task)`` returns when the policy is shown more (``ProceduralSource``: the whole task,
e.g. the shapes scene in its metadata). Metadata is otherwise left out: reasoning-gym's carries
the row index.

:func:`draw_held_out` takes ``num_tasks`` tasks of distinct content from the eval source in a
seeded order. :func:`split_held_out` walks the training source once and, unless the task space is
too small (below), removes every task whose content is held out, giving a :class:`SubsetSource`:
an indexable source, so ``TaskStream`` walks it, resumes it from ``state_dict`` and answers
``at(cursor)`` exactly as over any other source (the view is a pure function of the config).

When the held-out contents are more than ``MAX_CARVE_FRACTION`` of the training source's distinct
tasks, carving would change what training learns (64 of 1-digit sums' 121 distinct questions);
training then keeps the whole source and :class:`SplitReport` says how much of the draw it also
sees. The launcher refuses such a recipe on the login node unless it sets
``eval.allow_training_overlap`` (hetrl.launch.cli.check_held_out), and the run then calls its eval
a training-set reward (:attr:`SplitReport.reward_kind`), never a held-out one.

Cost, once per run in the orchestrator: the split builds every training task once and hashes its
content, O(N) time and memory for one 16-byte digest per distinct task and one index per kept task
(measured on 2 cores: 0.04 s for tiny_grpo's 2,000 reasoning-gym tasks, 0.9 s for 10,000 of
basic_arithmetic's default tasks, built and keyed on both sides; 0.4 s for a 200,000-row
JSONL file, on top of reading it, which happens twice when ``env.eval_tasks`` is null: once per
side, 1.9 s each). The draw builds only the tasks it looks at.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from hetrl.env.base import Task
from hetrl.env.tasks.base import TaskSource, TaskStream

# Carving more than this share of the training source's distinct tasks would no longer leave the
# training distribution as the recipe set it: report the overlap instead.
MAX_CARVE_FRACTION = 0.25


def content_key(task: Task, source: TaskSource) -> bytes:
    """A digest of the content of ``task``, one of ``source``'s, as canonical JSON: equal for the same prompt,
    whatever its id or row."""
    content = source.content_of(task) if hasattr(source, "content_of") else task.messages
    text = json.dumps(content, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


class SubsetSource:
    """The tasks of ``source`` at ``indices``, in that order; a task source itself."""

    def __init__(self, source: TaskSource, indices: list[int]) -> None:
        self.name = source.name
        self.source = source
        self.indices = indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Task:
        return self.source[self.indices[index]]


def draw_held_out(source: TaskSource, seed: int, num_tasks: int) -> list[tuple[Task, int]]:
    """``num_tasks`` tasks of distinct content, each with its episode seed, in the order of a stream over ``source``.

    A content seen already is skipped during the first pass over the source; a source with fewer
    distinct tasks than ``num_tasks`` then repeats them, as the stream cycles.
    """
    stream = TaskStream(source, seed=seed)
    drawn: list[tuple[Task, int]] = []
    seen: set[bytes] = set()
    while len(drawn) < num_tasks:
        task, episode_seed = stream.next()
        key = content_key(task, source)
        if key in seen and stream.cursor <= len(source):
            continue
        seen.add(key)
        drawn.append((task, episode_seed))
    return drawn


@dataclass(frozen=True)
class SplitReport:
    """What the split did; ``summary.json`` keeps it as ``held_out_split``."""

    num_training: int  # tasks of the training source, before the split
    num_distinct: int  # distinct contents among them
    num_held_out: int  # tasks of the held-out draw
    num_overlap: int  # held-out tasks whose content the training source holds
    num_shared: int  # distinct contents the two hold in common: what carving takes out
    num_removed: int  # training tasks carved out (all rows of each shared content)
    too_small: bool  # num_shared over MAX_CARVE_FRACTION of num_distinct: nothing carved

    @property
    def overlap_fraction(self) -> float:
        """The share of held-out tasks that training still sees: 0.0 after a carve."""
        return self.num_overlap / self.num_held_out if self.too_small else 0.0

    @property
    def reward_kind(self) -> str:
        """What a reward on the draw measures: "held-out", or "training-set" when training sees some of the draw."""
        return "training-set" if self.overlap_fraction else "held-out"

    @property
    def max_carvable(self) -> int:
        """The most distinct contents the draw may share with training and still be carved out."""
        return int(MAX_CARVE_FRACTION * self.num_distinct)

    def summary(self) -> str:
        """One line for the run's console."""
        if self.too_small:
            return (
                f"the task space is too small to split ({self.num_distinct:,} distinct tasks in "
                f"{self.num_training:,}, {self.num_shared} of them in the eval draw, at most {self.max_carvable} can "
                f"be carved out); {self.num_overlap} of {self.num_held_out} eval tasks ({self.overlap_fraction:.0%}) "
                "also appear in training: the eval reward is a training-set reward"
            )
        if not self.num_overlap:
            return (
                f"none of the {self.num_held_out} held-out tasks appears among the {self.num_training:,} "
                "training tasks (overlap 0%)"
            )
        return (
            f"{self.num_overlap} of {self.num_held_out} held-out tasks found in the training source, carved out "
            f"({self.num_removed:,} of {self.num_training:,} training tasks removed, training keeps "
            f"{self.num_training - self.num_removed:,}; overlap 0%)"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "overlap_fraction": self.overlap_fraction, "reward_kind": self.reward_kind}


@dataclass
class HeldOutSplit:
    held_out: list[tuple[Task, int]]  # the eval draw, with episode seeds
    training: TaskSource  # the training source without the held-out contents (or whole, when too small)
    report: SplitReport


def split_held_out(training: TaskSource, held_out: list[tuple[Task, int]], eval_source: TaskSource) -> HeldOutSplit:
    """Carve the contents of ``held_out`` (drawn from ``eval_source``) out of ``training``, or report their
    overlap when the task space is too small to split."""
    held_keys = [content_key(task, eval_source) for task, _ in held_out]
    held = set(held_keys)
    distinct: set[bytes] = set()
    kept: list[int] = []
    for index in range(len(training)):
        key = content_key(training[index], training)
        distinct.add(key)
        if key not in held:
            kept.append(index)
    shared = held & distinct
    too_small = len(shared) > MAX_CARVE_FRACTION * len(distinct)
    carve = bool(shared) and not too_small
    report = SplitReport(
        num_training=len(training),
        num_distinct=len(distinct),
        num_held_out=len(held_out),
        num_overlap=sum(key in shared for key in held_keys),
        num_shared=len(shared),
        num_removed=len(training) - len(kept) if carve else 0,
        too_small=too_small,
    )
    return HeldOutSplit(held_out, SubsetSource(training, kept) if carve else training, report)
