"""Batch assembly on the orchestrator: per-token advantages of complete groups."""

from __future__ import annotations

from hetrl.config.algorithm import AlgorithmConfig
from hetrl.types import Sample


def check_loop_support(algo: AlgorithmConfig) -> None:
    """Refuse, before the run starts, what the loop cannot honour (rather than silently ignoring it)."""
    if algo.kl_in_reward and algo.kl_coef > 0:
        raise ValueError("algorithm.kl_in_reward=true is not supported by the RL loop yet: the orchestrator computes the "
                         "advantages before the trainer has the reference log-probs the KL needs. Use the KL as a loss "
                         "term (algorithm.kl_in_reward=false) instead.")


def require_room(samples: list[Sample], max_episode_tokens: int, what: str) -> None:
    """Refuse a batch in which no episode had room to generate: a config error, not a zero reward."""
    if samples and all(s.info.get("stop_reason") == "prompt_too_long" for s in samples):
        shortest = min(len(s.prompt_ids) for s in samples)
        raise ValueError(f"no episode of the {what} had room to generate: every prompt ({len(samples)}, the shortest "
                         f"{shortest} tokens) fills env.max_episode_tokens={max_episode_tokens}. Raise "
                         "env.max_episode_tokens or shorten the prompts (env.system_prompt, env.tasks.answer_instruction).")


def advantages_for(algo: AlgorithmConfig, samples: list[Sample], max_tokens: int) -> list[list[float]]:
    """Per-token advantages of a step's samples (one list per sample, completion-aligned).

    The verifier rewards are shaped first (DAPO's overlong penalty against the generation budget
    ``max_tokens``, when ``algorithm.overlong_buffer > 0``). Group estimators see every sample of a
    group in the same call, which the orchestrator ensures by only ever batching complete groups.
    """
    import torch

    from hetrl.trainer.algorithms import compute_advantages, shape_rewards

    width = max((len(s.completion_ids) for s in samples), default=0)
    mask = torch.zeros(len(samples), max(width, 1))
    for row, s in enumerate(samples):
        mask[row, : len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.float32)
    rewards = shape_rewards(algo, torch.tensor([s.reward for s in samples], dtype=torch.float32), mask, max_tokens=max_tokens)
    advantages = compute_advantages(algo, rewards, [s.group_id for s in samples], mask)
    return [advantages[row, : len(s.completion_ids)].tolist() for row, s in enumerate(samples)]
