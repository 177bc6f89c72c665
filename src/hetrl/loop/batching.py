"""Batch checks on the orchestrator (the advantages are the trainer's: hetrl.trainer.rl_step)."""

from __future__ import annotations

from hetrl.records import SampleMeta


def require_room(samples: list[SampleMeta], max_episode_tokens: int, what: str) -> None:
    """Refuse a batch in which no episode had room to generate: a config error, not a zero reward."""
    if samples and all(s.info.get("stop_reason") == "prompt_too_long" for s in samples):
        shortest = min(s.prompt_len for s in samples)
        raise ValueError(
            f"no episode of the {what} had room to generate: every prompt ({len(samples)}, the shortest "
            f"{shortest} tokens) fills env.max_episode_tokens={max_episode_tokens}. Raise "
            "env.max_episode_tokens or shorten the prompts (env.system_prompt, env.tasks.answer_instruction)."
        )
