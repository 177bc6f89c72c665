"""``env:`` — which environment episodes run in and where its tasks come from.

Environment and task-source names resolve through allowlists in ``hetrl.env`` (a recipe can
never import arbitrary code).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from hetrl.config.base import Section


class TaskSourceConfig(Section):
    source: str = Field(
        "reasoning_gym",
        description="Task source: reasoning_gym, human_eval, file (JSONL/Parquet), file_ops (terminal tasks), shapes (image questions).",
    )
    name: str = Field("basic_arithmetic", description="reasoning_gym dataset name (e.g. basic_arithmetic, countdown, gsm_symbolic).")
    path: str | None = Field(None, description="source=file: path of the JSONL or Parquet file.")
    size: int = Field(10000, ge=1, description="Procedural sources (reasoning_gym, file_ops, shapes): tasks to draw (the stream cycles through them, reshuffled per epoch).")
    options: dict[str, Any] = Field(default_factory=dict, description="source=reasoning_gym: extra keyword arguments of the dataset (e.g. min_terms).")
    answer_instruction: str | None = Field(
        None,
        description="source=reasoning_gym: the sentence after each question that says how to format the answer; null = "
        "the source's own (answer inside <answer></answer> tags), \"\" = none (e.g. when a warm start teaches the format).",
    )


class EnvConfig(Section):
    name: str = Field("math", description="Environment: math, code, tool_math, terminal, multimodal.")
    tasks: TaskSourceConfig = Field(default_factory=TaskSourceConfig, description="Training task source.")
    eval_tasks: TaskSourceConfig | None = Field(None, description="Held-out task source for evaluation; null = tasks with a different seed.")
    system_prompt: str | None = Field(None, description="System message prepended to every episode; null = the environment's own.")
    max_turns: int = Field(1, ge=1, description="Turn budget per episode.")
    max_episode_tokens: int = Field(512, ge=16, description="Token budget per episode (prompt + all turns).")
    concurrency: int = Field(64, ge=1, description="Concurrent episodes per rollout worker.")
    placement: Literal["inline", "role"] = Field(
        "inline",
        description="Where environments run: inline = inside the rollout ranks, next to the engine; role = on env-server "
        "ranks of their own on the CPU partition (cluster.env_workers_per_node per CPU node), which the rollout ranks "
        "drive over the control plane (only tasks, messages and step results travel; the sampled token ids stay with "
        "the rollout). Use role when environment steps are heavy (sandboxed tools, terminals) or must not share the "
        "GPU nodes' cores.",
    )
    options: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments of the environment (e.g. code: max_attempts).")
