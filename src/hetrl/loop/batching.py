"""Batch assembly on the orchestrator: per-token advantages of complete groups."""

from __future__ import annotations

from hetrl.config.algorithm import AlgorithmConfig
from hetrl.types import Sample


def advantages_for(algo: AlgorithmConfig, samples: list[Sample]) -> list[list[float]]:
    """Per-token advantages of a step's samples (one list per sample, completion-aligned).

    Group estimators see every sample of a group in the same call, which the orchestrator ensures
    by only ever batching complete groups.
    """
    import torch

    from hetrl.trainer.algorithms import compute_advantages

    width = max((len(s.completion_ids) for s in samples), default=0)
    mask = torch.zeros(len(samples), max(width, 1))
    for row, s in enumerate(samples):
        mask[row, : len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.float32)
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    advantages = compute_advantages(algo, rewards, [s.group_id for s in samples], mask)
    return [advantages[row, : len(s.completion_ids)].tolist() for row, s in enumerate(samples)]
