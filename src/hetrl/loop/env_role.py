"""The env role: env-server ranks on the CPU partition that host the rollout ranks' episodes.

Ownership (``env.placement: role``): a rollout rank drives each episode (``hetrl.env.runner``): it
generates, keeps every sampled token id and tokenises the observations through the chat
template. The episode's environment (reset/step/close, tool calls, sandboxes) lives on one env
rank for the episode's whole life (:class:`hetrl.env.remote.EpisodeHost`). Only tasks, chat
messages and step results cross the control plane, never token ids, so token-in-token-out holds
exactly as with inline environments.

Wire (pickled by mpi4py, ``hetrl.env.remote``'s request/answer tuples): rollout -> env on
``Tag.WORK``: :class:`EnvCalls` (one poll round's requests to that rank) and
:class:`EnvClientDone` (the rollout rank is leaving); env -> rollout on ``Tag.RESULT``:
:class:`EnvReplies` (answers, plus the server's open-episode count) and :class:`EnvDown`. Nothing
blocks: both ends probe (``hetrl.control.comm.poll``) and sleep between probes; an env rank also
wakes as soon as one of its episodes' calls completes.

Routing: a new episode goes to the live env rank with the least load, where load is the server's
open-episode count in its last reply to this rollout rank plus the episodes this rank opened there
since; ties rotate by rollout rank, so rollout ranks starting together spread over the servers.

Failure, as for a reward worker whose scorer died: an env rank whose serving fails (injected with
the fault ``env:<rank>:env_crash@<n>``, hetrl.loop.faults) closes its environments, sends
:class:`EnvDown` to every rollout rank and serves nothing more. Each rollout rank reports the
episodes that lived there as
``failed``, and the orchestrator runs them again under the same sample ids (``requeued_generation``
in ``summary.json``) on the env ranks still up. With none left, the rollout rank raises and the job
stops with that error. An env rank exits once every rollout rank said :class:`EnvClientDone`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from hetrl.config.schema import HetrlConfig
from hetrl.control import liveness
from hetrl.control.comm import RoleContext, Tag, poll, send
from hetrl.control.protocol import EnvCalls, EnvClientDone, EnvDown, EnvReplies
from hetrl.env.base import Environment
from hetrl.env.registry import env_factory
from hetrl.env.remote import EnvServerLost, EpisodeHost, RemoteEnv, remote_failure
from hetrl.loop.faults import Countdown

logger = logging.getLogger(__name__)
_POLL_MIN_S = 0.0005
_POLL_MAX_S = 0.02


# ---------------------------------------------------------------------------------------- server


class EnvServer:
    """One env rank: runs every call of every client's episodes concurrently on one event loop."""

    def __init__(self, ctx: RoleContext, make_env: Callable[[], Environment], crash: Countdown) -> None:
        self.world = ctx.world
        self.clients = set(ctx.plan.ranks_of("rollout"))
        self.host = EpisodeHost(make_env)
        self.crash = crash
        self.replies: dict[int, list[tuple]] = defaultdict(list)
        self.jobs: set[asyncio.Task] = set()
        self.down = False
        self._closing: asyncio.Task | None = None  # the envs' release after going down
        self.num_calls = self.num_episodes = 0
        self._answered = asyncio.Event()

    async def run(self) -> None:
        delay = _POLL_MIN_S
        while self.clients:
            self._answered.clear()
            moved = self._receive() | self._flush()
            if not self.jobs:
                liveness.idle("waiting for env calls")
            elif moved:  # an answer went out or calls came in
                liveness.busy(f"serving {len(self.jobs)} env call(s) of {self.host.open_episodes} open episode(s)")
            if moved:
                delay = _POLL_MIN_S
                await asyncio.sleep(0)  # let the new calls start before probing again
                continue
            try:  # sleep until an episode's call completes, or the next probe of the wire is due
                await asyncio.wait_for(self._answered.wait(), timeout=delay)
            except TimeoutError:
                delay = min(delay * 2, _POLL_MAX_S)
        for job in self.jobs:
            job.cancel()  # nobody is left to answer
        await asyncio.gather(*self.jobs, return_exceptions=True)
        if self._closing is not None:
            await self._closing
        await self.host.close_all()
        logger.info("served %d call(s) of %d episode(s); all clients left", self.num_calls, self.num_episodes)

    def _receive(self) -> bool:
        got_any = False
        while (got := poll(self.world, tag=Tag.WORK)) is not None:
            message, source, _ = got
            got_any = True
            if isinstance(message, EnvClientDone):
                self.clients.discard(source)
            elif not isinstance(message, EnvCalls):
                raise TypeError(f"env rank got an unexpected {type(message).__name__} from rank {source}")
            elif not self.down:  # calls sent before a client heard EnvDown are dropped: it failed them
                self._start(source, message.calls)
        return got_any

    def _start(self, client: int, calls: list[tuple]) -> None:
        for request_id, method, episode_id, args in calls:
            if self.crash.fire():
                self._go_down("injected fault: the env server crashed")
                return
            self.num_calls += 1
            self.num_episodes += method == "reset"
            job = asyncio.get_running_loop().create_task(self._answer(client, request_id, method, episode_id, args))
            self.jobs.add(job)
            job.add_done_callback(self.jobs.discard)

    async def _answer(self, client: int, request_id: int, method: str, episode_id: str, args: tuple) -> None:
        reply = await self.host.answer(request_id, method, (client, episode_id), args)
        self.replies[client].append(reply)
        self._answered.set()

    def _flush(self) -> bool:
        sent = False
        for client, replies in self.replies.items():
            if replies:
                send(self.world, EnvReplies(replies, self.host.open_episodes), client, Tag.RESULT)
                sent = True
        self.replies.clear()
        return sent

    def _go_down(self, reason: str) -> None:
        """Stop serving for good: drop every episode, tell every client (it re-runs them elsewhere)."""
        logger.error("%s: dropping %d open episode(s) and leaving service", reason, self.host.open_episodes)
        self.down = True
        for job in self.jobs:
            job.cancel()
        self.replies.clear()
        self._closing = asyncio.get_running_loop().create_task(self.host.close_all())
        for client in self.clients:
            send(self.world, EnvDown(reason), client, Tag.RESULT)


def run_env(ctx: RoleContext, cfg: HetrlConfig, crash: Countdown) -> None:
    """The env rank's main: serve until every rollout rank has left (``crash``: the injected ``env_crash``)."""
    asyncio.run(EnvServer(ctx, env_factory(cfg.env, sandbox=cfg.reward.sandbox), crash).run())


# ---------------------------------------------------------------------------------------- client


class _RankLink:
    """The ``call`` a :class:`RemoteEnv` needs, bound to one env rank."""

    def __init__(self, client: EnvRoleClient, rank: int) -> None:
        self.client, self.rank = client, rank

    async def call(self, method: str, episode_id: str, *args: Any) -> Any:
        return await self.client.call(self.rank, method, episode_id, *args)


class EnvRoleClient:
    """A rollout rank's end of the env role: hands out episode proxies and moves their calls.

    Single-threaded: everything runs on the rollout rank's event loop, which calls :meth:`pump`
    once per round (replies in, queued calls out).
    """

    def __init__(self, ctx: RoleContext) -> None:
        self.world = ctx.world
        self.ranks = ctx.plan.ranks_of("env")
        if not self.ranks:
            raise ValueError(
                "env.placement=role but the plan has no env ranks: re-plan the run (launch.py writes plan.json)"
            )
        self.live = list(self.ranks)
        self.down_reasons: dict[int, str] = {}
        self.reported = dict.fromkeys(self.ranks, 0)  # open episodes per server, as it last said
        self.opened_since = dict.fromkeys(self.ranks, 0)  # ours opened there after that report
        self.pending: dict[int, tuple[int, asyncio.Future]] = {}
        self.outbox: dict[int, list[tuple]] = defaultdict(list)
        self.request_ids = itertools.count()
        self.episode_ids = itertools.count()
        self.rotation = ctx.assignment.role_rank
        self.closed = False

    def load(self, rank: int) -> int:
        return self.reported[rank] + self.opened_since[rank]

    def make_env(self) -> RemoteEnv:
        """A proxy for a new episode on the least-loaded live env rank; raises if none is left."""
        if not self.live:
            raise RuntimeError(
                f"all {len(self.ranks)} env rank(s) are down, no environment is left to run episodes on: "
                + "; ".join(f"rank {r}: {why}" for r, why in sorted(self.down_reasons.items()))
                + " (see logs/env_*.log; cluster.env_workers_per_node adds spare env ranks)"
            )
        n = len(self.ranks)
        rank = min(self.live, key=lambda r: (self.load(r), (self.ranks.index(r) - self.rotation) % n))
        self.opened_since[rank] += 1
        return RemoteEnv(_RankLink(self, rank), f"e{next(self.episode_ids)}")

    async def call(self, rank: int, method: str, episode_id: str, *args: Any) -> Any:
        if self.closed or rank not in self.live:
            raise EnvServerLost(self.down_reasons.get(rank, "the rollout rank's env client is closed"))
        request_id = next(self.request_ids)
        future = asyncio.get_running_loop().create_future()
        self.pending[request_id] = (rank, future)
        self.outbox[rank].append((request_id, method, episode_id, args))
        return await future

    def pump(self) -> bool:
        """Resolve arrived answers and send queued calls; never blocks. True if anything moved."""
        moved = False
        while (got := poll(self.world, tag=Tag.RESULT)) is not None:
            message, source, _ = got
            moved = True
            if source not in self.reported:
                raise TypeError(f"rollout rank got a {type(message).__name__} from rank {source}, which is no env rank")
            if isinstance(message, EnvReplies):
                self._resolve(source, message)
            elif isinstance(message, EnvDown):
                self._lose(source, message.reason)
            else:
                raise TypeError(f"rollout rank got an unexpected {type(message).__name__} from env rank {source}")
        for rank, calls in self.outbox.items():
            if calls:
                send(self.world, EnvCalls(calls), rank, Tag.WORK)
                moved = True
        self.outbox.clear()
        return moved

    def _resolve(self, rank: int, message: EnvReplies) -> None:
        self.reported[rank], self.opened_since[rank] = message.open_episodes, 0
        for request_id, ok, value in message.replies:
            _, future = self.pending.pop(request_id)
            if future.cancelled():  # its episode was cancelled meanwhile (an engine rebuild)
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(remote_failure(value))

    def _lose(self, rank: int, reason: str) -> None:
        """An env rank went down: fail every call waiting on it; its episodes fail on their next call."""
        logger.error("env rank %d is down (%s); its episodes are reported for a re-run", rank, reason)
        if rank in self.live:
            self.live.remove(rank)
        self.down_reasons[rank] = f"env rank {rank} is down: {reason}"
        self.outbox.pop(rank, None)
        self._fail_pending(lambda r: r == rank, self.down_reasons[rank])

    def _fail_pending(self, which: Callable[[int], bool], reason: str) -> None:
        for request_id, (rank, future) in list(self.pending.items()):
            if which(rank):
                del self.pending[request_id]
                if not future.done():
                    future.set_exception(EnvServerLost(reason))

    def close(self) -> None:
        """Leave every env rank (a down one still waits for its clients before it exits)."""
        self.closed = True
        self._fail_pending(lambda _: True, "the rollout rank is shutting down")
        self.outbox.clear()
        for rank in self.ranks:
            send(self.world, EnvClientDone(), rank, Tag.WORK)
