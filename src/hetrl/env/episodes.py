"""The one episode driver: many environment episodes at once, on the running asyncio loop.

The rollout role runs every :class:`EpisodeItem` the orchestrator sends it here, with its engine's
``generate``; tests and ``bench/env_throughput.py`` run the same driver with a scripted policy in
the engine's place. An episode holds an environment (a process, a sandbox, a connection to an env
rank) from its reset to its close; ``concurrency`` (``env.concurrency``) bounds how many do so at
once on one rank, and the others wait their turn before they make one (each sample records how long
in ``Sample.info["env_wait_s"]``: the step's ``episode/env_wait_s_mean`` says whether the bound
binds). Finished samples and the ids of failed episodes collect here until
:meth:`EpisodeRunner.take`, in finishing order.

An episode whose env rank went down (:class:`hetrl.env.remote.EnvServerLost`) is *failed*: the
orchestrator re-runs it from the start under the same sample id. Any other error of an episode is
a bug, raised by the next :meth:`EpisodeRunner.take`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from hetrl.env.base import Environment
from hetrl.env.chat import ChatCodec
from hetrl.env.remote import EnvServerLost
from hetrl.env.runner import GenerateFn, run_episode
from hetrl.records import ENV_WAIT_KEY, EpisodeItem, Sample, SamplingParams

logger = logging.getLogger(__name__)


def group_items(group_id: str, task: Any, seed: int, group_size: int) -> list[EpisodeItem]:
    """The episodes of one GRPO group: the same task, each with a seed of its own (drawn from ``seed``)."""
    return [EpisodeItem(f"{group_id}.{i}", group_id, task, seed * 1000 + i) for i in range(group_size)]


class EpisodeRunner:
    """Runs episodes concurrently, at most ``concurrency`` at once (None: all it is given), on one event loop."""

    def __init__(
        self,
        make_env: Callable[[], Environment],
        codec: ChatCodec,
        generate: GenerateFn,
        *,
        max_turns: int,
        max_episode_tokens: int,
        concurrency: int | None = None,
    ) -> None:
        if concurrency is not None and concurrency < 1:
            raise ValueError(f"concurrency must be >= 1 or None, got {concurrency}")
        self.make_env, self.codec, self.generate = make_env, codec, generate
        self.max_turns, self.max_episode_tokens = max_turns, max_episode_tokens
        self.concurrency = concurrency
        self._slots: asyncio.Semaphore | None = None  # made on first use, on the one event loop a runner serves
        self._held: dict[asyncio.Task, EpisodeItem] = {}
        self._finished: list[Sample] = []
        self._failed: list[str] = []
        self._errors: list[BaseException] = []

    def __len__(self) -> int:
        """Episodes started and not yet done (waiting for a slot included)."""
        return len(self._held)

    def start(self, item: EpisodeItem, sampling: SamplingParams) -> asyncio.Task:
        """Run ``item`` as a task of the running loop; sampling is seeded by the item's seed."""
        if self.concurrency is not None and self._slots is None:
            self._slots = asyncio.Semaphore(self.concurrency)
        task = asyncio.get_running_loop().create_task(self._episode(item, replace(sampling, seed=item.seed)))
        self._held[task] = item
        task.add_done_callback(self._done)
        return task

    def take(self) -> tuple[list[Sample], list[str]]:
        """The samples finished and the ids of episodes failed since the last call; raises an episode's error."""
        if self._errors:
            raise self._errors[0]
        finished, self._finished = self._finished, []
        failed, self._failed = self._failed, []
        return finished, failed

    def cancel(self) -> int:
        """Cancel every episode held (their ids are failed, for a re-run); how many.

        A task already done whose callback has not run yet has its sample among the finished ones,
        maybe already taken: it is not failed too, or its id would come back twice.
        """
        held = [(task, item) for task, item in self._held.items() if not task.done()]
        for task, item in held:
            task.cancel()
            self._failed.append(item.sample_id)
        self._held.clear()
        return len(held)

    async def _episode(self, item: EpisodeItem, sampling: SamplingParams) -> None:
        if self._slots is None:
            await self._run(item, sampling, waited_s=0.0)
            return
        queued, must_wait = time.monotonic(), self._slots.locked()
        await self._slots.acquire()  # cancelled while waiting: it holds no slot
        try:
            await self._run(item, sampling, waited_s=time.monotonic() - queued if must_wait else 0.0)
        finally:
            self._slots.release()

    async def _run(self, item: EpisodeItem, sampling: SamplingParams, waited_s: float) -> None:
        env = self.make_env()
        try:
            try:
                sample = await run_episode(
                    env,
                    item.task,
                    item.seed,
                    self.generate,
                    self.codec,
                    sampling,
                    self.max_turns,
                    self.max_episode_tokens,
                    item.sample_id,
                    item.group_id,
                )
            finally:
                await env.close()
        except EnvServerLost as lost:
            logger.warning("episode %s lost its environment (%s); reporting it for a re-run", item.sample_id, lost)
            self._failed.append(item.sample_id)
            return
        sample.info[ENV_WAIT_KEY] = waited_s
        self._finished.append(sample)

    def _done(self, task: asyncio.Task) -> None:
        self._held.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            self._errors.append(task.exception())
