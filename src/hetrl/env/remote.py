"""Environments in their own processes: the env role, separate from the engines.

Episodes whose steps are heavy (sandboxes, rendering) or must live on the CPU partition run in
env server processes; the rollout side holds ``RemoteEnv`` proxies with the ordinary
``Environment`` interface, so ``run_episode`` and ``EnvWorker`` work unchanged (token handling
stays on the rollout side, next to the engine's ids).

Ownership: each episode is pinned to one server for its whole life (its state lives there); a
server runs all its episodes concurrently on one asyncio loop. The wire is any duplex object with
``send``/``recv`` of picklable tuples — a ``multiprocessing`` pipe here; an MPI communicator pair
fits the same two calls. Requests are ``(request_id, method, episode_id, args)``, answers
``(request_id, ok, value)`` where a failed call's value is the server-side traceback text.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import threading
import traceback
from concurrent.futures import Future
from typing import Any

from hetrl.config.env import EnvConfig
from hetrl.env.base import Environment, Message, StepResult, Task


async def _serve(conn: Any, cfg: EnvConfig) -> None:
    from hetrl.env.registry import env_factory

    make_env = env_factory(cfg)
    envs: dict[str, Environment] = {}
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task] = set()

    async def handle(request_id: int, method: str, episode_id: str, args: tuple) -> None:
        try:
            if method == "reset":
                envs[episode_id] = make_env()
                value = await envs[episode_id].reset(*args)
            elif method == "step":
                if episode_id not in envs:
                    raise RuntimeError(f"episode {episode_id}: step before reset")
                value = await envs[episode_id].step(*args)
            else:  # close
                env = envs.pop(episode_id, None)
                value = await env.close() if env is not None else None
            conn.send((request_id, True, value))
        except Exception:  # an env bug must reach the caller, not kill the server's other episodes
            conn.send((request_id, False, traceback.format_exc()))

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
    for env in envs.values():
        await env.close()


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
                future.set_exception(RuntimeError(f"remote environment failed:\n{value}"))
        for future in self.futures.values():
            future.set_exception(RuntimeError("the env server went away"))

    async def call(self, method: str, episode_id: str, *args: Any) -> Any:
        future: Future = Future()
        with self.lock:
            request_id = next(self.ids)
            self.futures[request_id] = future
            self.conn.send((request_id, method, episode_id, args))
        return await asyncio.wrap_future(future)


class RemoteEnv(Environment):
    """Proxy of one episode on an env server."""

    def __init__(self, link: _Link, episode_id: str) -> None:
        super().__init__()
        self._link = link
        self.episode_id = episode_id

    async def reset(self, task: Task, seed: int) -> list[Message]:
        return await self._link.call("reset", self.episode_id, task, seed)

    async def step(self, action: Message) -> StepResult:
        return await self._link.call("step", self.episode_id, action)

    async def close(self) -> None:
        await self._link.call("close", self.episode_id)


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

    def __enter__(self) -> "EnvProcessPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
