"""An orchestrator without processes, for the tests of its dispatch and result handling: its real methods on
hand-made state, its sends recorded instead of sent, results handed to its handlers directly."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

from hetrl.control.protocol import RewardDone, RolloutDone, ScoredSample
from hetrl.loop import orchestrator as orchestrator_module
from hetrl.loop.orchestrator import Orchestrator, _Ledger
from hetrl.records import Sample, SampleMeta

RANK = 0  # the orchestrator's world rank


def bare_orchestrator(
    monkeypatch: Any, cfg: Any, engines: list[int], reward_ranks: list[int], version: int = 0
) -> tuple[Orchestrator, list[Any]]:
    """An orchestrator over ``engines`` and ``reward_ranks`` with ``cfg`` (a namespace of the keys the test
    needs); every message it sends lands in the returned list."""
    sent: list[Any] = []
    monkeypatch.setattr(orchestrator_module, "send", lambda world, message, rank, tag: sent.append(message))
    orch = Orchestrator.__new__(Orchestrator)
    orch.ctx, orch.monitor, orch.cfg = SimpleNamespace(world=None, rank=RANK), None, cfg
    orch.sampling = lambda purpose: None
    orch.version, orch.ledger, orch.adaptive_bound, orch.layout = version, _Ledger(), None, None
    orch.engines, orch.reward_ranks = list(engines), list(reward_ranks)
    orch.engine_load, orch.reward_load = dict.fromkeys(engines, 0), dict.fromkeys(reward_ranks, 0)
    orch.groups, orch.results, orch.ready, orch.purpose_of = defaultdict(list), defaultdict(list), [], {}
    orch.regenerated, orch.refused_pushes, orch._next_group, orch._train_groups_open = 0, 0, 0, 0
    orch._open_tasks, orch._resumed, orch._reward_s = {}, [], defaultdict(float)
    orch._held, orch._early, orch._reward_of = {}, {}, {}
    return orch, sent


def finish(orch: Orchestrator, engine: int, reward_rank: int, samples: list[Sample], score_s: float = 0.0) -> None:
    """``samples`` come back from ``engine`` (their metadata) and from ``reward_rank`` (a 0.0 verdict each)."""
    orch._on_rollout(RolloutDone([SampleMeta.of(s) for s in samples]), engine)
    verdicts = [ScoredSample(s.sample_id, {}, 0.0, [], {}) for s in samples]
    orch._on_reward(RewardDone(verdicts, score_s=score_s), reward_rank)
