"""Work items and messages of the RL loop, as they cross the control plane (pickled by mpi4py).

The orchestrator owns every sample id; a worker only ever answers with the ids it was given, so
the orchestrator can prove that each sample was generated, rewarded and trained at most once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hetrl.types import Sample, SamplingParams


@dataclass
class EpisodeItem:
    """One episode to run: ``group_size`` items share a ``group_id`` (the same task)."""

    sample_id: str
    group_id: str
    task: Any  # hetrl.env.base.Task
    seed: int


@dataclass
class RolloutWork:
    items: list[EpisodeItem]
    sampling: SamplingParams
    purpose: str = "train"  # "train" | "eval"


@dataclass
class RolloutDone:
    samples: list[Sample]
    failed: list[str] = field(default_factory=list)  # sample ids the engine could not finish (re-queued)
    error: str | None = None


@dataclass
class RewardWork:
    samples: list[Sample]


@dataclass
class RewardDone:
    samples: list[Sample]  # the same samples, rewards/flags filled in


@dataclass
class TrainWork:
    """One optimizer step's full batch. ``advantages`` has one list per sample (per token)."""

    step: int
    samples: list[Sample]
    advantages: list[list[float]]
    supervised: bool = False  # warm-start: maximise the likelihood of demonstrations


@dataclass
class TrainDone:
    step: int
    version: int
    metrics: dict[str, float]


@dataclass
class SyncWeights:
    """Engines: receive weights of ``version`` now (the trainer is sending them)."""

    version: int


@dataclass
class Checkpoint:
    """Trainer ranks: save a checkpoint with the loop's state (data cursor, counters)."""

    step: int
    loop_state: dict[str, Any]


@dataclass
class Shutdown:
    reason: str = "done"
