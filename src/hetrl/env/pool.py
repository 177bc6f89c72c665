"""Many concurrent episodes in one process: the env worker.

``EnvWorker`` pulls tasks from a ``TaskStream``, runs ``group_size`` episodes per task (one GRPO
group, each episode with its own seed) with at most ``concurrency`` episodes in flight on one
asyncio loop, and returns the finished Samples. Episode ids derive from the stream cursor, so a
resumed run produces the same ids for the same tasks (the loop can de-duplicate across restarts).

It depends only on a ``generate`` callable and a ``make_env`` factory, so the same worker drives
local environments, ``EnvProcessPool`` proxies or env-role proxies (``hetrl.loop.env_role``) with an
engine or a scripted policy (tests, ``bench/env_throughput.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from hetrl.env.base import Environment, Task
from hetrl.env.chat import ChatCodec
from hetrl.env.runner import GenerateFn, run_episode
from hetrl.env.tasks.base import TaskStream
from hetrl.types import Sample, SamplingParams


class EnvWorker:
    """Runs groups of episodes from ``stream``; ``state_dict`` is the stream's cursor."""

    def __init__(
        self,
        make_env: Callable[[], Environment],
        stream: TaskStream,
        codec: ChatCodec,
        sampling: SamplingParams,
        max_turns: int,
        max_episode_tokens: int,
        concurrency: int = 64,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.make_env = make_env
        self.stream = stream
        self.codec = codec
        self.sampling = sampling
        self.max_turns = max_turns
        self.max_episode_tokens = max_episode_tokens
        self.concurrency = concurrency

    async def _episode(self, slots: asyncio.Semaphore, task: Task, seed: int, generate: GenerateFn,
                       sample_id: str, group_id: str) -> Sample:
        async with slots:
            env = self.make_env()
            try:
                return await run_episode(env, task, seed, generate, self.codec, self.sampling, self.max_turns,
                                         self.max_episode_tokens, sample_id=sample_id, group_id=group_id)
            finally:
                await env.close()

    async def run_groups(self, num_groups: int, group_size: int, generate: GenerateFn) -> list[list[Sample]]:
        """The next ``num_groups`` tasks of the stream, ``group_size`` episodes each, all concurrently."""
        slots = asyncio.Semaphore(self.concurrency)  # per call: a semaphore is bound to one event loop
        jobs = []
        for _ in range(num_groups):
            cursor = self.stream.cursor
            task, seed = self.stream.next()
            group_id = f"g{cursor}"
            jobs.append([self._episode(slots, task, seed + k, generate, f"{group_id}-{k}", group_id) for k in range(group_size)])
        flat = await asyncio.gather(*(ep for group in jobs for ep in group))
        return [list(flat[i * group_size:(i + 1) * group_size]) for i in range(num_groups)]

    def state_dict(self) -> dict[str, Any]:
        return {"stream": self.stream.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state["stream"])
