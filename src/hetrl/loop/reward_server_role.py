"""The reward_server role: replicas of the frozen judge and reward model, serving every reward worker.

Ownership: a reward server holds the models the rubric needs (``reward.served_models``: a judge
on vLLM, a sequence-classification reward model, or both; ``hetrl.reward.serving``) and never
changes their weights. Reward workers are its clients: their reward functions ask for judge
completions and reward-model scores through :class:`RewardServerClient`, many at once from the
worker's scoring threads, and the server answers whatever arrived since its last round in one
batched call per model, so the requests of every worker share each forward pass.

The wire, routing, deadlines and Ready/Down are the service layer's (``hetrl.control.service``): a
request is ``(model, payload)``, routed to the ready replica with the least load; the server says
``Ready`` once its models are loaded and runs its rounds on ``RoleLoop.run``. A server exits once
every reward worker said ``ClientDone``.

Failure, as for a rollout engine: a request the model cannot take (too long for the judge's
context, a chat template that refuses it) is answered with its error; a server whose batched
forward fails (injected with the fault ``reward_server:<rank>:server_crash@n``) tells every client
``Down`` and serves nothing more, and each client sends the requests that server held to a live
replica. With no replica left the reward worker raises and the job stops (to be requeued):
scoring on without the model would train on default scores. A request unanswered for
``reward.server.request_timeout_s`` goes to a replica that has not had it yet, or keeps waiting
where it is; after ``reward.server.max_attempts`` such timeouts it fails with
:class:`hetrl.reward.base.ScoringUnavailable`. Requests wait for a replica to be ready without a
clock: a replica still loading its models is under the liveness watchdog like every starting rank.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from hetrl.config.reward import POLICY_MODEL
from hetrl.config.schema import HetrlConfig
from hetrl.control import liveness, timeline
from hetrl.control.comm import RoleContext
from hetrl.control.role_loop import RoleLoop
from hetrl.control.service import Call, Client, Service, ServiceDown
from hetrl.loop.faults import Countdown
from hetrl.reward.base import ScoringUnavailable
from hetrl.reward.serving import Completion, CompletionResult, JudgeEngine, RewardModelScorer, resolve_model_path

logger = logging.getLogger(__name__)
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
        self.models, self.crash = models, crash
        self.service = Service(ctx, "reward")
        self.loop = RoleLoop(ctx, self.service.handlers)
        self.num_requests = self.num_batches = 0

    def run(self) -> None:
        self.service.ready()
        self.loop.run(self._round, idle="waiting for judge / reward-model requests")
        logger.info(
            "served %d request(s) in %d batch(es); all reward workers left", self.num_requests, self.num_batches
        )

    def _round(self) -> bool:
        """Serve what arrived, in one batch per model; stop once every reward worker left."""
        calls = self.service.receive()
        if calls:
            # Reported before the forward, not after the round: a forward that never returns leaves this rank busy
            # without progress, and the watchdog names it.
            liveness.busy(f"serving {len(calls)} request(s)")
            self._serve(calls)
        self.loop.stop = not self.service.clients_left
        return self.service.flush() or bool(calls)

    def _serve(self, calls: list[Call]) -> None:
        answered: list[tuple[Call, Any]] = []
        t0 = time.time()
        try:
            if self.crash.fire():
                raise RuntimeError("injected fault: the reward server crashed")
            for model, batch in _by_model(calls).items():
                answered += zip(batch, self._answer(model, [call.payload for call in batch]))
        except Exception as error:  # noqa: BLE001 - a batched forward failed: the clients retry on another replica
            self._go_down(f"{type(error).__name__}: {error}")
            return
        timeline.record("serve", t0, time.time())
        self.num_requests += len(calls)
        self.num_batches += 1
        for call, answer in answered:
            ok = not isinstance(answer, Exception)
            self.service.reply(call.client, call.request_id, ok, answer if ok else f"{type(answer).__name__}: {answer}")

    def _answer(self, model: str, payloads: list[Any]) -> list[Any]:
        if model not in self.models:
            return [ValueError(f"this server holds no {model} (it holds {sorted(self.models)})")] * len(payloads)
        if model == JUDGE:
            return self.models[JUDGE].complete(payloads)
        return self.models[REWARD_MODEL].score(payloads)

    def _go_down(self, reason: str) -> None:
        logger.error("%s: leaving service; the reward workers re-send its requests to other replicas", reason)
        self.service.go_down(reason)


def _by_model(calls: list[Call]) -> dict[str, list[Call]]:
    grouped: dict[str, list[Call]] = defaultdict(list)
    for call in calls:
        grouped[call.method].append(call)
    return grouped


def run_reward_server(ctx: RoleContext, cfg: HetrlConfig, policy_dir: Path, crash: Countdown) -> None:
    """The reward server's main: load the frozen models, serve until every reward worker has left."""
    RewardServer(ctx, load_served_models(cfg, policy_dir), crash).run()


# ---------------------------------------------------------------------------------------- client


class RewardServerClient(Client):
    """A reward worker's end of the reward_server role.

    Reward functions on the worker's scoring threads call :meth:`judge` and :meth:`reward_model`, which queue a
    request and wait for its answer; the worker's main thread, the only one that touches MPI, calls :meth:`pump`.
    A request no replica answers fails with :class:`ScoringUnavailable`.
    """

    def __init__(
        self, ctx: RoleContext, timeout_s: float, max_attempts: int, wake: threading.Event | None = None
    ) -> None:
        super().__init__(
            ctx,
            "reward_server",
            timeout_s=timeout_s,
            max_attempts=max_attempts,
            timeout_key="reward.server.request_timeout_s",
            attempts_key="reward.server.max_attempts",
            replicas_key="reward.server.replicas",
            wake=wake,
        )

    def lost(self, reason: str) -> Exception:
        return ScoringUnavailable(reason)

    # -- the scoring threads' side

    def judge(self, request: Completion) -> CompletionResult:
        return self._ask(JUDGE, request)

    def reward_model(self, messages: list[dict[str, str]]) -> float:
        return self._ask(REWARD_MODEL, messages)

    def _ask(self, model: str, payload: Any) -> Any:
        # pump() answers, re-sends or fails every request: after max_attempts timeouts at the latest, once a replica is
        # ready (a loading one is the watchdog's); this bound only keeps a thread from outliving a main loop that died.
        return self.request(model, payload).result(timeout=self.timeout_s * (self.max_attempts + 1) + _READY_GRACE_S)

    # -- the main thread's side

    def pump(self) -> bool:
        """The service's pump; with every replica down it raises: scoring on would train on default scores."""
        moved = super().pump()
        if self.all_down:
            raise ServiceDown(self.all_down)
        return moved
