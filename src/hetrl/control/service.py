"""Request/reply services over the control plane: a :class:`Client` on the calling ranks, a :class:`Service` on
the serving ones.

Two roles serve others: env ranks host the rollout ranks' episodes (``hetrl.loop.env_role``), reward_server
replicas hold the judge and the reward model for every reward worker (``hetrl.loop.reward_server_role``). Both
follow the rules below; a role adds only what it serves and the errors its callers expect (:meth:`Client.lost`,
:meth:`Client.refused`).

Wire (``hetrl.control.protocol``): client -> server on ``Tag.WORK``: :class:`Requests` (everything the client
queued for that server since its last pump, in one message) and :class:`ClientDone`; server -> client on
``Tag.RESULT``: :class:`Ready`, :class:`Replies` (with the server's load) and :class:`Down`.

Threads: nothing blocks inside MPI (``hetrl.control.comm``), and one thread of a rank touches MPI. So
:meth:`Client.request` only queues and returns a ``concurrent.futures.Future``, from any thread (a reward worker's
scoring threads wait on ``.result()``, a rollout rank's episodes ``await asyncio.wrap_future(f)``);
:meth:`Client.pump`, on the MPI thread, brings replies in, retries what is overdue and sends what is queued.

Routing: a request goes to the ready live server with the least load (its load in its last reply plus what this
client routed to it since; ties rotate by the client's role rank, so clients starting together spread out), or
stays on the server it is pinned to (``server=``: an env episode lives on the rank that holds its state; pick one
with :meth:`Client.pick`).

Peers may disappear, so every request has a deadline (``timeout_s`` after it was sent): an unpinned one then goes
to a ready replica that has not had it yet (or waits on where every ready one has), and fails after
``max_attempts`` timeouts; a pinned one fails at once. A server that says :class:`Down` fails the requests pinned
to it, and its unpinned ones go elsewhere; with every server down, everything waiting and everything asked later
fails with :class:`ServiceDown`, naming each server and why. A request waits for a ready server without a clock
only while some server has said neither Ready nor Down: a server still loading its models is under the liveness
watchdog like every starting rank.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, NamedTuple

from hetrl.control.comm import RoleContext, Tag, send
from hetrl.control.protocol import ClientDone, Down, Ready, Replies, Requests
from hetrl.control.role_loop import Handler, RoleLoop

logger = logging.getLogger(__name__)


class ServiceDown(RuntimeError):
    """Every server of the service is down: nothing is left to serve the request."""


class Call(NamedTuple):
    """One request as a server sees it: who asked, under which of the client's ids, what."""

    client: int
    request_id: int
    method: str
    payload: Any


@dataclass
class _Request:
    method: str
    payload: Any
    future: Future
    pinned: bool
    server: int | None = None  # the pinned server, or where it was last sent
    sent_at: float | None = None  # monotonic; None while queued
    tried: tuple[int, ...] = ()
    timeouts: int = 0


def _settle(future: Future, value: Any = None, error: BaseException | None = None) -> None:
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)
    except InvalidStateError:  # cancelled meanwhile (an engine rebuild cancels its episodes): nobody waits for it
        pass


class Client:
    """A calling rank's end of one service; see the module docstring for the rules.

    ``timeout_key``, ``attempts_key`` and ``replicas_key`` are the recipe keys behind ``timeout_s``,
    ``max_attempts`` and the number of servers: the errors name them, so the fix is one look away.
    """

    def __init__(
        self,
        ctx: RoleContext,
        service_role: str,
        *,
        timeout_s: float,
        max_attempts: int,
        timeout_key: str,
        attempts_key: str,
        replicas_key: str,
        wake: threading.Event | None = None,
    ) -> None:
        self.world, self.role, self.service_role = ctx.world, ctx.role, service_role
        self.servers = list(ctx.plan.ranks_of(service_role))
        if not self.servers:
            raise ValueError(
                f"the {ctx.role} role needs the {service_role} role but the plan has no {service_role} rank: "
                "re-plan the run (launch.py writes plan.json)"
            )
        self.timeout_s, self.max_attempts = timeout_s, max_attempts
        self.timeout_key, self.attempts_key, self.replicas_key = timeout_key, attempts_key, replicas_key
        self.wake = wake  # set when a request is queued: the MPI thread's nap ends
        self.rotation = ctx.assignment.role_rank
        self.ready: set[int] = set()
        self.down: dict[int, str] = {}  # server -> why
        self.all_down = ""  # the error once every server is down
        self.reported = dict.fromkeys(self.servers, 0)  # each server's load in its last reply
        self.routed = dict.fromkeys(self.servers, 0)  # what this client routed to it since
        self.num_resent = 0
        self._lock = threading.Lock()
        self._pending: dict[int, _Request] = {}
        self._queued: list[int] = []
        self._ids = itertools.count()
        self._closed = False
        handlers: dict[type, Handler] = {Replies: self._on_replies, Ready: self._on_ready, Down: self._on_down}
        self._loop = RoleLoop(ctx, handlers, tag=Tag.RESULT)

    # -- hooks: the errors a role's callers expect

    def lost(self, reason: str) -> Exception:
        """The error of a request no server will answer: its server went down, its deadline passed, or this rank
        is leaving."""
        return RuntimeError(reason)

    def refused(self, method: str, text: str) -> Exception:
        """The error of a request its server answered with an error (``text``, the server's)."""
        return RuntimeError(f"the {self.service_role} rank could not take the {method} request: {text}")

    # -- any thread

    def request(self, method: str, payload: Any, server: int | None = None) -> Future:
        """Queue a request (sent at the next :meth:`pump`); ``server`` pins it there. The future holds the answer
        or the error."""
        future: Future = Future()
        with self._lock:
            refusal = self._refusal(server)
            if refusal is None:
                request_id = next(self._ids)
                self._pending[request_id] = _Request(method, payload, future, server is not None, server)
                self._queued.append(request_id)
        if refusal is not None:
            future.set_exception(refusal)
        elif self.wake is not None:
            self.wake.set()
        return future

    def pick(self) -> int:
        """A server for work that will live there (an env episode): the least-loaded ready live one, else a live
        one still starting. It counts in that server's load at once, so the next pick sees it."""
        with self._lock:
            if self.all_down:
                raise ServiceDown(self.all_down)
            server = self._least_loaded(self._ready_live() or self._live())
            self.routed[server] += 1
            return server

    def _refusal(self, server: int | None) -> Exception | None:
        if self._closed:
            return self.lost(f"the {self.role} rank is shutting down")
        if server is not None and server in self.down:  # an episode's close after its rank went down: it is gone
            return self.lost(self._down_text(server))
        if self.all_down:
            return ServiceDown(self.all_down)
        return None

    # -- the MPI thread

    def pump(self) -> bool:
        """Replies in, overdue requests retried or failed, queued ones sent; never blocks. True if anything moved."""
        moved = self._loop.receive()
        self._retry_overdue()
        return self._send_queued() or moved

    def _on_replies(self, message: Replies, server: int) -> None:
        with self._lock:
            self.reported[server], self.routed[server] = message.load, 0
            answered = [(self._pending.pop(request_id, None), ok, value) for request_id, ok, value in message.replies]
        for request, ok, value in answered:
            if request is None:  # answered already: a late reply from a replica given up on
                continue
            if ok:
                _settle(request.future, value)
            else:
                _settle(request.future, error=self.refused(request.method, value))

    def _on_ready(self, message: Ready, server: int) -> None:
        with self._lock:
            if server not in self.down:
                self.ready.add(server)

    def _on_down(self, message: Down, server: int) -> None:
        logger.error(
            "%s rank %d is down (%s); what it held goes elsewhere or fails", self.service_role, server, message.reason
        )
        failed: list[tuple[Future, Exception]] = []
        with self._lock:
            self.down[server] = message.reason
            self.ready.discard(server)
            for request_id, request in list(self._pending.items()):
                if request.server != server:
                    continue
                if request.pinned:
                    del self._pending[request_id]
                    failed.append((request.future, self.lost(self._down_text(server))))
                elif request.sent_at is not None:
                    request.sent_at = None
                    self._queued.append(request_id)
                    self.num_resent += 1
            if not self._live():
                self.all_down = (
                    f"all {len(self.servers)} {self.service_role} rank(s) are down: "
                    + "; ".join(f"rank {s}: {why}" for s, why in sorted(self.down.items()))
                    + f" (see logs/{self.service_role}_*.log; {self.replicas_key} adds ranks)"
                )
                failed += [(request.future, ServiceDown(self.all_down)) for request in self._pending.values()]
                self._pending.clear()
                self._queued.clear()
        for future, error in failed:
            _settle(future, error=error)

    def _retry_overdue(self) -> None:
        now = time.monotonic()
        failed: list[tuple[Future, Exception]] = []
        with self._lock:
            for request_id, request in list(self._pending.items()):
                if request.sent_at is None or now - request.sent_at <= self.timeout_s:
                    continue
                request.timeouts += 1
                if request.pinned or request.timeouts >= self.max_attempts:
                    del self._pending[request_id]
                    failed.append((request.future, self.lost(self._overdue_text(request))))
                elif any(s not in request.tried for s in self._ready_live()):
                    request.sent_at = None
                    self._queued.append(request_id)
                    self.num_resent += 1
                else:
                    request.sent_at = now  # every ready replica has it: waiting on beats piling duplicates on one
        for future, error in failed:
            _settle(future, error=error)
        if failed:
            logger.warning("%d %s request(s) failed: %s", len(failed), self.service_role, failed[0][1])

    def _send_queued(self) -> bool:
        now = time.monotonic()
        batches: dict[int, list[tuple[int, str, Any]]] = defaultdict(list)
        with self._lock:
            queued, self._queued = self._queued, []
            for request_id in queued:
                request = self._pending.get(request_id)
                if request is None:  # failed meanwhile
                    continue
                server = request.server if request.pinned else self._route(request)
                if server is None or server not in self.ready:  # none ready yet: it waits, without a clock
                    self._queued.append(request_id)
                    continue
                if not request.pinned:
                    self.routed[server] += 1
                request.server, request.sent_at, request.tried = server, now, (*request.tried, server)
                batches[server].append((request_id, request.method, request.payload))
        for server, calls in batches.items():
            send(self.world, Requests(calls), server, Tag.WORK)
        return bool(batches)

    def close(self) -> None:
        """Fail what still waits (its threads and tasks finish at once) and leave every server (a down one too:
        it waits for its clients before it exits)."""
        with self._lock:
            self._closed = True
            pending, self._pending, self._queued = self._pending, {}, []
        for request in pending.values():
            _settle(request.future, error=self.lost(f"the {self.role} rank is shutting down"))
        if self.num_resent:
            logger.info("re-sent %d %s request(s) to another rank over the run", self.num_resent, self.service_role)
        for server in self.servers:
            send(self.world, ClientDone(), server, Tag.WORK)

    # -- under the lock

    def _live(self) -> list[int]:
        return [s for s in self.servers if s not in self.down]

    def _ready_live(self) -> list[int]:
        return [s for s in self.servers if s in self.ready and s not in self.down]

    def _least_loaded(self, candidates: list[int]) -> int:
        n = len(self.servers)
        return min(
            candidates,
            key=lambda s: (self.reported[s] + self.routed[s], (self.servers.index(s) - self.rotation) % n),
        )

    def _route(self, request: _Request) -> int | None:
        ready = self._ready_live()
        untried = [s for s in ready if s not in request.tried] or ready
        return self._least_loaded(untried) if untried else None

    def _down_text(self, server: int) -> str:
        return f"{self.service_role} rank {server} is down: {self.down[server]}"

    def _overdue_text(self, request: _Request) -> str:
        text = (
            f"{request.method} request unanswered after {request.timeouts} x {self.timeout_key}={self.timeout_s:g} s "
            f"on {self.service_role} rank(s) {list(request.tried)}"
        )
        return text if request.pinned else f"{text} ({self.attempts_key}={self.max_attempts})"


class Service:
    """A serving rank's end: the calls that arrived, the replies it batches per client, Ready and Down.

    Its :attr:`handlers` go into the rank's :class:`RoleLoop` (which polls ``Tag.WORK``); each round the role takes
    :meth:`receive`'s calls, answers them with :meth:`reply` (now or later) and sends with :meth:`flush`. The rank
    exits once :attr:`clients_left` is empty. ``load`` is what clients route by (default: requests held).
    """

    def __init__(self, ctx: RoleContext, client_role: str, load: Callable[[], int] | None = None) -> None:
        self.world = ctx.world
        self.clients_left = set(ctx.plan.ranks_of(client_role))
        self.held = 0  # calls received and not yet answered
        self.load = load or (lambda: self.held)
        self.down = False
        self.handlers: dict[type, Handler] = {Requests: self._take, ClientDone: self._leave}
        self._calls: list[Call] = []
        self._replies: dict[int, list[tuple[int, bool, Any]]] = defaultdict(list)

    def _take(self, message: Requests, client: int) -> None:
        if not self.down:  # sent before the client heard Down: it has failed or re-sent them
            self._calls += [Call(client, *call) for call in message.calls]
            self.held += len(message.calls)

    def _leave(self, message: ClientDone, client: int) -> None:
        self.clients_left.discard(client)

    def receive(self) -> list[Call]:
        """The calls that arrived since the last receive (none once down)."""
        calls, self._calls = self._calls, []
        return calls

    def reply(self, client: int, request_id: int, ok: bool, value: Any) -> None:
        """Queue an answer for the next :meth:`flush` (``value``: the error's text when not ok)."""
        if not self.down:
            self._replies[client].append((request_id, ok, value))
            self.held -= 1

    def flush(self) -> bool:
        """One :class:`Replies` per client with answers queued, carrying this server's load. True if any went."""
        sent = False
        for client, replies in self._replies.items():
            if replies:
                send(self.world, Replies(replies, self.load()), client, Tag.RESULT)
                sent = True
        self._replies.clear()
        return sent

    def ready(self) -> None:
        """Tell every client this server serves from now on."""
        for client in self.clients_left:
            send(self.world, Ready(), client, Tag.RESULT)

    def go_down(self, reason: str) -> None:
        """Stop serving for good: drop every call and answer held, tell every client (it retries elsewhere or
        fails)."""
        self.down = True
        self._calls.clear()
        self._replies.clear()
        self.held = 0
        for client in self.clients_left:
            send(self.world, Down(reason), client, Tag.RESULT)
