"""Environments in other processes: the server and client halves every transport shares.

Episodes whose steps are heavy (sandboxes, rendering) or must live on the CPU partition run in
env server processes; the rollout side holds ``RemoteEnv`` proxies with the ordinary
``Environment`` interface, so ``run_episode`` and ``EpisodeRunner`` work unchanged (token handling
stays on the rollout side, next to the engine's ids; only tasks, messages and step results travel).

Ownership: each episode is pinned to one server for its whole life (its state lives there); a
server runs all its episodes concurrently on one asyncio loop (:class:`EpisodeHost`). Requests are
``(request_id, method, episode_id, args)``, answers ``(request_id, ok, value)`` where a failed
call's value is the server-side traceback text. Two transports carry them: a ``multiprocessing``
pipe per server (:class:`EnvProcessPool`, here) and the MPI control plane between rollout ranks
and env-role ranks (``hetrl.loop.env_role``). A server that goes away fails its episodes' calls
with :class:`EnvServerLost`, which the caller may answer by running the episode again elsewhere.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import threading
import traceback
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any

from hetrl.config.env import EnvConfig
from hetrl.env.base import Environment, Message, StepResult, Task
from hetrl.env.registry import env_factory


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


async def _serve(conn: Any, cfg: EnvConfig) -> None:

    host = EpisodeHost(env_factory(cfg))
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task] = set()

    async def handle(request_id: int, method: str, episode_id: str, args: tuple) -> None:
        conn.send(await host.answer(request_id, method, episode_id, args))

    while True:
        try:
            request = await loop.run_in_executor(None, conn.recv)
        except EOFError:  # the client died: finish what is running and release the envs
            request = None
        if request is None:
            break
        job = asyncio.create_task(handle(*request))
        pending.add(job)
        job.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    await host.close_all()


def serve(conn: Any, cfg: EnvConfig) -> None:
    """Serve environment calls on ``conn`` until it sends ``None`` (process entry point)."""
    asyncio.run(_serve(conn, cfg))


class _Link:
    """The client end of one server: sends requests, a reader thread resolves their futures."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.futures: dict[int, Future] = {}
        self.ids = itertools.count()
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                request_id, ok, value = self.conn.recv()
            except (EOFError, OSError):
                break
            future = self.futures.pop(request_id)
            if ok:
                future.set_result(value)
            else:
                future.set_exception(remote_failure(value))
        for future in self.futures.values():
            future.set_exception(EnvServerLost("the env server went away"))

    async def call(self, method: str, episode_id: str, *args: Any) -> Any:
        future: Future = Future()
        with self.lock:
            request_id = next(self.ids)
            self.futures[request_id] = future
            self.conn.send((request_id, method, episode_id, args))
        return await asyncio.wrap_future(future)


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


class EnvProcessPool:
    """``num_servers`` env server processes for ``cfg``; ``make_env`` hands out proxies round-robin."""

    def __init__(self, cfg: EnvConfig, num_servers: int) -> None:
        if num_servers < 1:
            raise ValueError(f"num_servers must be >= 1, got {num_servers}")
        ctx = mp.get_context("spawn")  # no fork: the parent may hold threads, engines, MPI
        self.processes, self.links = [], []
        for _ in range(num_servers):
            parent, child = ctx.Pipe()
            process = ctx.Process(target=serve, args=(child, cfg), daemon=True)
            process.start()
            self.processes.append(process)
            self.links.append(_Link(parent))
        self._episodes = itertools.count()

    def make_env(self) -> RemoteEnv:
        n = next(self._episodes)
        return RemoteEnv(self.links[n % len(self.links)], f"e{n}")

    def close(self) -> None:
        for link, process in zip(self.links, self.processes):
            link.conn.send(None)
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()

    def __enter__(self) -> EnvProcessPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
