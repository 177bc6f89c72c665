"""The reward_server role: replicas of the frozen judge and reward model, serving every reward worker.

Ownership: a reward server holds the models the rubric needs (``reward.served_models``: a judge
on vLLM, a sequence-classification reward model, or both; ``hetrl.reward.serving``) and never
changes their weights. Reward workers are its clients: their reward functions ask for judge
completions and reward-model scores through :class:`RewardServerClient`, many at once from the
worker's scoring threads, and the server answers whatever arrived since its last round in one
batched call per model, so the requests of every worker share each forward pass.

Wire (pickled by mpi4py): reward -> server on ``Tag.WORK``: :class:`ServeCalls` (one pump round's
requests to that server) and :class:`ServeClientDone` (the worker is leaving); server -> reward on
``Tag.RESULT``: :class:`ServerReady` (its models are loaded), :class:`ServeReplies` and
:class:`ServerDown`. Nothing blocks inside MPI: both ends poll (``hetrl.control.comm.poll``) and nap
between polls. A server exits once every reward worker said :class:`ServeClientDone`.

Failure, as for a rollout engine: a request the model cannot take (too long for the judge's
context, a chat template that refuses it) is answered with its error; a server whose batched
forward fails (injected with the fault ``reward_server:<rank>:server_crash@n``) tells every client
:class:`ServerDown` and serves nothing more, and each client sends the requests that server held to
a live replica. With no replica left the reward worker raises and the job stops (to be requeued):
scoring on without the model would train on default scores. A request unanswered for
``reward.server.request_timeout_s`` goes to a replica that has not had it yet, or keeps waiting
where it is; after ``reward.server.max_attempts`` such timeouts it fails with
:class:`hetrl.reward.base.ScoringUnavailable`, and its sample goes back to the orchestrator to be
scored again. Requests wait for a replica to be ready without a clock: a replica still loading its
models is under the liveness watchdog like every starting rank.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetrl.config.reward import POLICY_MODEL
from hetrl.config.schema import HetrlConfig
from hetrl.control import liveness, timeline
from hetrl.control.comm import RoleContext, Tag, poll, send
from hetrl.control.protocol import ServeCalls, ServeClientDone, ServerDown, ServeReplies, ServerReady
from hetrl.loop.faults import Countdown
from hetrl.reward.base import ScoringUnavailable
from hetrl.reward.serving import Completion, CompletionResult, JudgeEngine, RewardModelScorer, resolve_model_path

logger = logging.getLogger(__name__)
_POLL_MIN_S = 0.0005
_POLL_MAX_S = 0.02
_READY_GRACE_S = 3600.0  # a scoring thread's own bound also covers a replica still loading a large judge
JUDGE, REWARD_MODEL = "judge", "reward_model"


# ---------------------------------------------------------------------------------------- server


def load_served_models(cfg: HetrlConfig, policy_dir: Path) -> dict[str, Any]:
    """The models this server holds, by name ("judge": JudgeEngine, "reward_model": RewardModelScorer)."""
    models: dict[str, Any] = {}
    reward = cfg.reward
    if JUDGE in reward.served_models:
        liveness.starting("starting the judge engine")
        models[JUDGE] = JudgeEngine(
            resolve_model_path(reward.judge.model, policy_dir), reward.judge, reward.server, cfg.run.seed
        )
    if REWARD_MODEL in reward.served_models:
        liveness.starting("loading the reward model")
        path = reward.reward_model.path
        models[REWARD_MODEL] = RewardModelScorer(
            resolve_model_path(path, policy_dir), reward.reward_model, cfg.run.seed, fresh_head=path == POLICY_MODEL
        )
    return models


class RewardServer:
    """One replica: rounds of (take every arrived request, answer them in one batch per model)."""

    def __init__(self, ctx: RoleContext, models: dict[str, Any], crash: Countdown) -> None:
        self.world, self.models, self.crash = ctx.world, models, crash
        self.clients = set(ctx.plan.ranks_of("reward"))
        self.down = False
        self.num_requests = self.num_batches = 0

    def run(self) -> None:
        for client in self.clients:
            send(self.world, ServerReady(), client, Tag.RESULT)
        delay = _POLL_MIN_S
        while self.clients:
            calls = self._receive()
            if not calls:
                liveness.idle("waiting for judge / reward-model requests")
                time.sleep(delay)
                delay = min(delay * 2, _POLL_MAX_S)
                continue
            delay = _POLL_MIN_S
            liveness.busy(f"serving {len(calls)} request(s)")
            self._serve(calls)
            liveness.tick()
        logger.info(
            "served %d request(s) in %d batch(es); all reward workers left", self.num_requests, self.num_batches
        )

    def _receive(self) -> list[tuple[int, int, str, Any]]:
        """``(client, request_id, model, payload)`` of every request that arrived."""
        calls = []
        while (got := poll(self.world, tag=Tag.WORK)) is not None:
            message, source, _ = got
            if isinstance(message, ServeClientDone):
                self.clients.discard(source)
            elif not isinstance(message, ServeCalls):
                raise TypeError(f"reward server got an unexpected {type(message).__name__} from rank {source}")
            elif not self.down:  # requests sent before a client heard ServerDown: it re-sends them elsewhere
                calls += [(source, *call) for call in message.calls]
        return calls

    def _serve(self, calls: list[tuple[int, int, str, Any]]) -> None:
        replies: dict[int, list[tuple[int, bool, Any]]] = defaultdict(list)
        t0 = time.time()
        try:
            if self.crash.fire():
                raise RuntimeError("injected fault: the reward server crashed")
            for model, batch in _by_model(calls).items():
                answers = self._answer(model, [payload for _, _, _, payload in batch])
                for (client, request_id, _, _), answer in zip(batch, answers):
                    ok = not isinstance(answer, Exception)
                    replies[client].append((request_id, ok, answer if ok else f"{type(answer).__name__}: {answer}"))
        except Exception as error:  # noqa: BLE001 - a batched forward failed: the clients retry on another replica
            self._go_down(f"{type(error).__name__}: {error}")
            return
        timeline.record("serve", t0, time.time())
        self.num_requests += len(calls)
        self.num_batches += 1
        for client, answers in replies.items():
            send(self.world, ServeReplies(answers), client, Tag.RESULT)

    def _answer(self, model: str, payloads: list[Any]) -> list[Any]:
        if model not in self.models:
            return [ValueError(f"this server holds no {model} (it holds {sorted(self.models)})")] * len(payloads)
        if model == JUDGE:
            return self.models[JUDGE].complete(payloads)
        return self.models[REWARD_MODEL].score(payloads)

    def _go_down(self, reason: str) -> None:
        logger.error("%s: leaving service; the reward workers re-send its requests to other replicas", reason)
        self.down = True
        for client in self.clients:
            send(self.world, ServerDown(reason), client, Tag.RESULT)


def _by_model(calls: list[tuple[int, int, str, Any]]) -> dict[str, list[tuple[int, int, str, Any]]]:
    grouped: dict[str, list[tuple[int, int, str, Any]]] = defaultdict(list)
    for call in calls:
        grouped[call[2]].append(call)
    return grouped


def run_reward_server(ctx: RoleContext, cfg: HetrlConfig, policy_dir: Path, crash: Countdown) -> None:
    """The reward server's main: load the frozen models, serve until every reward worker has left."""
    RewardServer(ctx, load_served_models(cfg, policy_dir), crash).run()


# ---------------------------------------------------------------------------------------- client


@dataclass
class _Pending:
    model: str
    payload: Any
    future: Future
    server: int = -1  # where it was last sent (-1: not yet)
    sent_at: float = 0.0
    tried: tuple[int, ...] = ()
    timeouts: int = 0


class RewardServerClient:
    """A reward worker's end of the reward_server role.

    Thread-safe where it must be: reward functions on the worker's scoring threads call
    :meth:`judge` and :meth:`reward_model`, which queue a request and wait for its answer; the
    worker's main thread, the only one that touches MPI, calls :meth:`pump`. A request goes to the
    ready live replica with the fewest requests outstanding.
    """

    def __init__(
        self, ctx: RoleContext, timeout_s: float, max_attempts: int, wake: threading.Event | None = None
    ) -> None:
        self.world = ctx.world
        self.servers = ctx.plan.ranks_of("reward_server")
        if not self.servers:
            raise ValueError("the rubric uses a served model but the plan has no reward_server rank: re-plan the run")
        self.live, self.ready = list(self.servers), set()
        self.down_reasons: dict[int, str] = {}
        self.timeout_s, self.max_attempts = timeout_s, max_attempts
        self.wake = wake or threading.Event()  # set when a scoring thread queues a request: the main loop's nap ends
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._unsent: list[int] = []
        self._ids = itertools.count()
        self._closed = False
        self.num_resent = 0

    # -- the scoring threads' side

    def judge(self, request: Completion) -> CompletionResult:
        return self._ask(JUDGE, request)

    def reward_model(self, messages: list[dict[str, str]]) -> float:
        return self._ask(REWARD_MODEL, messages)

    def _ask(self, model: str, payload: Any) -> Any:
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise ScoringUnavailable("the reward worker is shutting down")
            request_id = next(self._ids)
            self._pending[request_id] = _Pending(model, payload, future)
            self._unsent.append(request_id)
        self.wake.set()
        # pump() answers, re-sends or fails every request: after max_attempts timeouts at the latest, once a replica is
        # ready (a loading one is the watchdog's); this bound only keeps a thread from outliving a main loop that died.
        return future.result(timeout=self.timeout_s * (self.max_attempts + 1) + _READY_GRACE_S)

    # -- the main thread's side

    def pump(self) -> bool:
        """Resolve arrived answers, re-send timed-out requests, send queued ones; never blocks. True if anything
        moved."""
        moved = False
        while (got := poll(self.world, tag=Tag.RESULT)) is not None:
            message, source, _ = got
            moved = True
            if isinstance(message, ServeReplies):
                self._resolve(message)
            elif isinstance(message, ServerReady):
                self.ready.add(source)
            elif isinstance(message, ServerDown):
                self._lose(source, message.reason)
            else:
                raise TypeError(f"reward worker got an unexpected {type(message).__name__} from rank {source}")
        self._retry_overdue()
        return self._send_queued() or moved

    def _resolve(self, message: ServeReplies) -> None:
        with self._lock:
            answered = [(self._pending.pop(request_id, None), ok, value) for request_id, ok, value in message.replies]
        for pending, ok, value in answered:
            if pending is None or pending.future.done():  # answered already: a late reply from a replica given up on
                continue
            if ok:
                pending.future.set_result(value)
            else:  # the model could not take this request (its own fault, not the server's): the source's error
                pending.future.set_exception(
                    RuntimeError(f"the reward server could not take the {pending.model} request: {value}")
                )

    def _lose(self, server: int, reason: str) -> None:
        logger.error("reward server rank %d is down (%s); its requests go to the other replicas", server, reason)
        if server in self.live:
            self.live.remove(server)
        self.down_reasons[server] = reason
        if not self.live:
            raise RuntimeError(
                "every reward server is down, so no judge or reward model is left to score with: "
                + "; ".join(f"rank {r}: {why}" for r, why in sorted(self.down_reasons.items()))
                + " (see logs/reward_server_*.log; reward.server.replicas adds replicas)"
            )
        with self._lock:
            held = [
                request_id
                for request_id, p in self._pending.items()
                if p.server == server and request_id not in self._unsent
            ]
            self._unsent += held
        self.num_resent += len(held)

    def _retry_overdue(self) -> None:
        """A request a replica has held for request_timeout_s: to an untried replica if there is one, else it waits
        on."""
        now = time.monotonic()
        failed: list[_Pending] = []
        with self._lock:
            unsent = set(self._unsent)
            for request_id, p in list(self._pending.items()):
                if p.server < 0 or request_id in unsent or now - p.sent_at <= self.timeout_s:
                    continue
                p.timeouts += 1
                if p.timeouts >= self.max_attempts:
                    del self._pending[request_id]
                    failed.append(p)
                elif any(s not in p.tried for s in self.live if s in self.ready):
                    self._unsent.append(request_id)
                    self.num_resent += 1
                else:
                    p.sent_at = now  # every ready replica has it: waiting on is better than piling duplicates on one
        for p in failed:
            p.future.set_exception(
                ScoringUnavailable(
                    f"{p.model} request unanswered after {p.timeouts} x "
                    f"reward.server.request_timeout_s={self.timeout_s:g} s "
                    f"on replica(s) {list(p.tried)} (reward.server.max_attempts={self.max_attempts})"
                )
            )
        if failed:
            logger.warning("%d reward-server request(s) failed after %d timeouts each", len(failed), self.max_attempts)

    def _send_queued(self) -> bool:
        batches: dict[int, list[tuple[int, str, Any]]] = defaultdict(list)
        with self._lock:
            queued, self._unsent = self._unsent, []
            load: dict[int, int] = defaultdict(int)
            for p in self._pending.values():
                load[p.server] += 1
            for request_id in queued:
                pending = self._pending.get(request_id)
                if pending is None:
                    continue
                server = self._pick(pending, load)
                if server is None:  # no replica ready yet: it stays queued, without a clock
                    self._unsent.append(request_id)
                    continue
                load[server] += 1
                pending.server, pending.sent_at, pending.tried = server, time.monotonic(), (*pending.tried, server)
                batches[server].append((request_id, pending.model, pending.payload))
        for server, calls in batches.items():
            send(self.world, ServeCalls(calls), server, Tag.WORK)
        return bool(batches)

    def _pick(self, pending: _Pending, load: dict[int, int]) -> int | None:
        ready = [s for s in self.live if s in self.ready]
        untried = [s for s in ready if s not in pending.tried] or ready
        return min(untried, key=lambda s: (load[s], s)) if untried else None

    def close(self) -> None:
        """Fail what is still waiting (the scoring threads finish at once, asking nothing more) and leave every
        server."""
        with self._lock:
            self._closed = True
            pending, self._pending, self._unsent = self._pending, {}, []
        for p in pending.values():
            if not p.future.done():
                p.future.set_exception(ScoringUnavailable("the reward worker is shutting down"))
        if self.num_resent:
            logger.info("re-sent %d reward-server request(s) to another replica over the run", self.num_resent)
        for server in self.servers:
            send(self.world, ServeClientDone(), server, Tag.WORK)
