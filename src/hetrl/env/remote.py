"""Environments in other processes: the server and client halves every transport shares.

Episodes whose steps are heavy (sandboxes, rendering) or must live on the CPU partition run in
env server processes; the rollout side holds ``RemoteEnv`` proxies with the ordinary
``Environment`` interface, so ``run_episode`` and ``EpisodeRunner`` work unchanged (token handling
stays on the rollout side, next to the engine's ids; only tasks, messages and step results travel).

Ownership: each episode is pinned to one server for its whole life (its state lives there); a
server runs all its episodes concurrently on one asyncio loop (:class:`EpisodeHost`). Requests are
``(request_id, method, episode_id, args)``, answers ``(request_id, ok, value)`` where a failed
call's value is the server-side traceback text. The MPI control plane carries them between rollout
ranks and env-role ranks (``hetrl.loop.env_role``). A server that goes away fails its episodes' calls
with :class:`EnvServerLost`, which the caller may answer by running the episode again elsewhere.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Hashable
from typing import Any

from hetrl.env.base import Environment, Message, StepResult, Task


class EnvServerLost(RuntimeError):
    """The server that held an episode went away; the episode's state is gone with it."""


def remote_failure(traceback_text: str) -> RuntimeError:
    """The caller-side error of a call that raised on the server (an environment bug)."""
    return RuntimeError(f"remote environment failed:\n{traceback_text}")


class EpisodeHost:
    """The server half: one environment per open episode, created by ``reset``, dropped by ``close``.

    ``key`` identifies an episode on this server; a server with several clients keys by
    ``(client, episode_id)`` so their ids cannot collide.
    """

    def __init__(self, make_env: Callable[[], Environment]) -> None:
        self.make_env = make_env
        self.envs: dict[Hashable, Environment] = {}

    @property
    def open_episodes(self) -> int:
        return len(self.envs)

    async def call(self, method: str, key: Hashable, args: tuple) -> Any:
        if method == "reset":
            self.envs[key] = self.make_env()
            return await self.envs[key].reset(*args)
        if method == "step":
            if key not in self.envs:
                raise RuntimeError(f"episode {key}: step before reset")
            return await self.envs[key].step(*args)
        if method == "close":
            env = self.envs.pop(key, None)
            return await env.close() if env is not None else None
        raise ValueError(f"unknown environment method {method!r}; valid: reset, step, close")

    async def answer(self, request_id: int, method: str, key: Hashable, args: tuple) -> tuple[int, bool, Any]:
        """The reply tuple; an env bug reaches the caller as text instead of killing the other episodes."""
        try:
            return request_id, True, await self.call(method, key, args)
        except Exception:  # noqa: BLE001 - reported to the caller, the server carries on
            return request_id, False, traceback.format_exc()

    async def close_all(self) -> None:
        """Release every open episode (the clients are gone, or this server is going down)."""
        envs, self.envs = list(self.envs.values()), {}
        for env in envs:
            await env.close()


class RemoteEnv(Environment):
    """Proxy of one episode on an env server; ``link`` is any object with ``async call(method, episode_id, *args)``."""

    def __init__(self, link: Any, episode_id: str) -> None:
        super().__init__()
        self._link = link
        self.episode_id = episode_id

    async def reset(self, task: Task, seed: int) -> list[Message]:
        return await self._link.call("reset", self.episode_id, task, seed)

    async def step(self, action: Message) -> StepResult:
        return await self._link.call("step", self.episode_id, action)

    async def close(self) -> None:
        try:
            await self._link.call("close", self.episode_id)
        except EnvServerLost:
            pass  # the episode's state went with its server: nothing left to release
