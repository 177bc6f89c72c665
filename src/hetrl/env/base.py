"""The episode contract between an environment and the rollout that drives it.

An environment speaks chat messages, never tokens: ``reset`` returns the first observation (the
prompt messages), ``step`` takes the policy's assistant message and returns the next observation
messages, an optional per-turn reward, whether the episode is over, and free-form info. Turning
messages into tokens is the runner's job (``hetrl.env.runner``), so that every environment gets
token-in-token-out for free and none of them can re-tokenise what the policy sampled.

One environment instance runs one episode at a time; the caller creates it, runs ``reset`` and the
``step`` calls, then ``close`` (which must release sandboxes and temp directories even when the
episode was cut short). Methods are ``async`` so that thousands of episodes share one event loop
while their tools and sandboxes wait on subprocesses.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

# A chat message as the HF chat templates take it: {"role": ..., "content": str | list of parts}.
# Multimodal content is a list of parts, e.g. [{"type": "image", "image": <PIL.Image>},
# {"type": "text", "text": "..."}]; tool results carry "name" and "tool_call_id".
Message = dict[str, Any]


@dataclass
class Task:
    """One problem, as a task source yields it. Picklable, so it can cross the control plane.

    ``answer`` is what a reward worker checks against (a reference answer, or tests for code); it is
    never shown to the policy. ``metadata`` carries source-specific extras (e.g. the reasoning-gym
    entry its scorer needs, or the parameters of a procedural scene).
    """

    task_id: str
    source: str
    messages: list[Message]
    answer: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepResult:
    """What ``Environment.step`` returns.

    ``reward`` is ``None`` for turns the environment does not score (most of them); when the
    episode ends the runner sums the non-None rewards into ``Sample.rewards["env"]``.
    """

    observations: list[Message]
    reward: float | None = None
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Environment(ABC):
    """Base class of every environment; see the module docstring for the lifecycle."""

    #: Default system prompt; ``EnvConfig.system_prompt`` overrides it.
    system_prompt: str | None = None

    def __init__(self, system_prompt: str | None = None) -> None:
        if system_prompt is not None:
            self.system_prompt = system_prompt

    def initial_messages(self, task: Task) -> list[Message]:
        """The task's messages behind this environment's system prompt (unless the task has one)."""
        messages = [dict(m) for m in task.messages]
        if self.system_prompt and (not messages or messages[0].get("role") != "system"):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    @abstractmethod
    async def reset(self, task: Task, seed: int) -> list[Message]:
        """Start an episode on ``task``; all randomness of the episode must derive from ``seed``."""

    @abstractmethod
    async def step(self, action: Message) -> StepResult:
        """Apply the policy's assistant message and return what it observes next."""

    async def close(self) -> None:
        """Release what the episode holds (sandboxes, temp directories). Safe to call twice."""
