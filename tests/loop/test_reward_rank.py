"""A reward rank on its role loop without MPI: the engines' work and the orchestrator's Shutdown scripted, its
answers (to the orchestrator) recorded."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hetrl.config.reward import RewardConfig
from hetrl.control import role_loop
from hetrl.control.protocol import RewardDone, RewardWork, ScoredSample, ScoringView, Shutdown
from hetrl.loop import reward_role
from hetrl.loop.faults import Fault, RankFaults
from hetrl.records import Sample

ORCHESTRATOR, ENGINE = 0, 4


def _views(*ids: str) -> list[ScoringView]:
    text = "<think>t</think> \\boxed{1}"
    return [
        ScoringView.of(Sample(i, "t0", "toy", [1], [2, 3], [1, 1], [0.0, 0.0], [0, 0], completion_text=text), False)
        for i in ids
    ]


def _run(monkeypatch: pytest.MonkeyPatch, works: list[RewardWork], faults: str = "") -> list[RewardDone]:
    """Each work arrives once every answer to the previous one is in; Shutdown once all are answered."""
    sent: list[RewardDone] = []
    destinations: set[int] = set()
    queue: list = [*works, Shutdown()]
    expected = 0

    def poll(comm, source=None, tag=None):
        nonlocal expected
        assert source is None  # work comes from any engine
        answered = sum(len(d.scored) + len(d.failed) for d in sent)
        if answered < expected:
            return None
        if not queue:
            return None
        work = queue.pop(0)
        expected += len(getattr(work, "views", []))
        return work, ENGINE if isinstance(work, RewardWork) else ORCHESTRATOR, int(tag)

    monkeypatch.setattr(role_loop, "poll", poll)
    monkeypatch.setattr(
        reward_role, "send", lambda comm, message, rank, tag: (sent.append(message), destinations.add(rank))
    )
    ctx = SimpleNamespace(world="world", orchestrator_rank=ORCHESTRATOR, role="reward", assignment=None)
    cfg = SimpleNamespace(reward=RewardConfig(functions=[{"name": "format"}], workers=2))
    reward_role.RewardRank(ctx, cfg, RankFaults(Fault.parse(faults), "reward", 0)).run()
    assert destinations <= {ORCHESTRATOR}  # verdicts go to the orchestrator, whoever sent the work
    return sent


def test_a_reward_rank_answers_each_view_with_a_verdict_then_stops_on_shutdown(monkeypatch):
    sent = _run(monkeypatch, [RewardWork(_views("t0.0", "t0.1"))])
    scored = sorted((s for d in sent for s in d.scored), key=lambda s: s.sample_id)
    assert [type(s) for s in scored] == [ScoredSample] * 2 and [s.sample_id for s in scored] == ["t0.0", "t0.1"]
    assert all(s.reward == 1.0 and s.rewards == {"format": 1.0} for s in scored)
    assert not any(d.failed for d in sent) and all(d.score_s >= 0 for d in sent)


def test_a_crashed_scorer_fails_its_work_back_and_scores_the_next_on_a_rebuilt_rubric(monkeypatch):
    sent = _run(monkeypatch, [RewardWork(_views("t0.0")), RewardWork(_views("t0.0"))], "reward:0:scorer_crash@1")
    assert sent[0].failed == ["t0.0"] and not sent[0].scored
    assert [s.sample_id for d in sent[1:] for s in d.scored] == ["t0.0"]
