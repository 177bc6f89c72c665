"""The env role: env-server ranks on the CPU partition that host the rollout ranks' episodes.

Ownership (``env.placement: role``): a rollout rank drives each episode (``hetrl.env.runner``): it
generates, keeps every sampled token id and tokenises the observations through the chat
template. The episode's environment (reset/step/close, tool calls, sandboxes) lives on one env
rank for the episode's whole life (:class:`hetrl.env.remote.EpisodeHost`). Only tasks, chat
messages and step results cross the control plane, never token ids, so token-in-token-out holds
exactly as with inline environments.

The wire, routing, deadlines and Ready/Down are the service layer's (``hetrl.control.service``): a
call is a request ``(method, (episode_id, args))`` pinned to the episode's env rank, which
:meth:`EnvRoleClient.make_env` picks as the least loaded (load: the server's open episodes in its
last reply plus the episodes this rollout rank opened there since). An env rank runs every call of
every episode concurrently on one event loop (``RoleLoop.arun``) and wakes as soon as one of them
completes, to send its answer.

Failure, as for a reward worker whose scorer died: an env rank whose serving fails (injected with
the fault ``env:<rank>:env_crash@<n>``, hetrl.loop.faults) closes its environments, sends
``Down`` to every rollout rank and serves nothing more; a call its rank leaves unanswered for
``env.call_timeout_s`` fails too. Either way the episode's call raises
:class:`hetrl.env.remote.EnvServerLost`, the rollout rank reports the episode as ``failed``, and the
orchestrator runs it again under the same sample id (``requeued_generation`` in ``summary.json``)
on the env ranks still up. With none left, ``make_env`` raises and the job stops with that error.
An env rank exits once every rollout rank said ``ClientDone``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any

from hetrl.config.schema import HetrlConfig
from hetrl.control.comm import RoleContext
from hetrl.control.role_loop import RoleLoop
from hetrl.control.service import Call, Client, Service
from hetrl.env.base import Environment
from hetrl.env.registry import env_factory
from hetrl.env.remote import EnvServerLost, EpisodeHost, RemoteEnv, remote_failure
from hetrl.loop.faults import Countdown

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------- server


class EnvServer:
    """One env rank: runs every call of every client's episodes concurrently on one event loop."""

    def __init__(self, ctx: RoleContext, make_env: Callable[[], Environment], crash: Countdown) -> None:
        self.host = EpisodeHost(make_env)
        self.service = Service(ctx, "rollout", load=lambda: self.host.open_episodes)
        self.loop = RoleLoop(ctx, self.service.handlers)
        self.crash = crash
        self.jobs: set[asyncio.Task] = set()
        self._closing: asyncio.Task | None = None  # the envs' release after going down
        self.num_calls = self.num_episodes = 0
        self._answered = asyncio.Event()  # a call completed: its answer goes out without waiting out a nap

    async def run(self) -> None:
        self.service.ready()
        await self.loop.arun(self._round, self._activity, "waiting for env calls", awake=self._answered)
        for job in self.jobs:
            job.cancel()  # nobody is left to answer
        await asyncio.gather(*self.jobs, return_exceptions=True)
        if self._closing is not None:
            await self._closing
        await self.host.close_all()
        logger.info("served %d call(s) of %d episode(s); all clients left", self.num_calls, self.num_episodes)

    async def _round(self) -> bool:
        """Start the calls that arrived, send the answers that completed; stop once every client left."""
        calls = self.service.receive()
        for call in calls:
            if self.crash.fire():
                self._go_down("injected fault: the env server crashed")
                break
            self._start(call)
        self.loop.stop = not self.service.clients_left
        return self.service.flush() or bool(calls)

    def _activity(self) -> str | None:
        if not self.jobs:
            return None
        return f"serving {len(self.jobs)} env call(s) of {self.host.open_episodes} open episode(s)"

    def _start(self, call: Call) -> None:
        self.num_calls += 1
        self.num_episodes += call.method == "reset"
        job = asyncio.get_running_loop().create_task(self._answer(call))
        self.jobs.add(job)
        job.add_done_callback(self.jobs.discard)

    async def _answer(self, call: Call) -> None:
        episode_id, args = call.payload
        _, ok, value = await self.host.answer(call.request_id, call.method, (call.client, episode_id), args)
        self.service.reply(call.client, call.request_id, ok, value)
        self._answered.set()

    def _go_down(self, reason: str) -> None:
        """Stop serving for good: drop every episode, tell every client (it re-runs them elsewhere)."""
        logger.error("%s: dropping %d open episode(s) and leaving service", reason, self.host.open_episodes)
        self.service.go_down(reason)
        for job in self.jobs:
            job.cancel()
        self._closing = asyncio.get_running_loop().create_task(self.host.close_all())


def run_env(ctx: RoleContext, cfg: HetrlConfig, crash: Countdown) -> None:
    """The env rank's main: serve until every rollout rank has left (``crash``: the injected ``env_crash``)."""
    asyncio.run(EnvServer(ctx, env_factory(cfg.env, sandbox=cfg.reward.sandbox), crash).run())


# ---------------------------------------------------------------------------------------- client


class _RankLink:
    """The ``call`` a :class:`RemoteEnv` needs, pinned to one env rank."""

    def __init__(self, client: EnvRoleClient, rank: int) -> None:
        self.client, self.rank = client, rank

    async def call(self, method: str, episode_id: str, *args: Any) -> Any:
        return await asyncio.wrap_future(self.client.request(method, (episode_id, args), server=self.rank))


class EnvRoleClient(Client):
    """A rollout rank's end of the env role: hands out episode proxies; the rank's loop calls :meth:`pump`.

    A call that fails because its env rank went down or did not answer within ``env.call_timeout_s`` raises
    :class:`EnvServerLost` (the episode runner reports the episode for a re-run); one that raised on the env rank
    raises that error's traceback (an environment bug).
    """

    def __init__(self, ctx: RoleContext, call_timeout_s: float) -> None:
        # Every call is pinned to its episode's rank: a timed-out one fails at once, so there is no attempt bound.
        super().__init__(
            ctx,
            "env",
            timeout_s=call_timeout_s,
            max_attempts=1,
            timeout_key="env.call_timeout_s",
            attempts_key="",
            replicas_key="cluster.env_workers_per_node",
        )
        self.episode_ids = itertools.count()

    def lost(self, reason: str) -> Exception:
        return EnvServerLost(reason)

    def refused(self, method: str, text: str) -> Exception:
        return remote_failure(text)

    def make_env(self) -> RemoteEnv:
        """A proxy for a new episode on the least-loaded live env rank; raises ServiceDown if none is left."""
        return RemoteEnv(_RankLink(self, self.pick()), f"e{next(self.episode_ids)}")
