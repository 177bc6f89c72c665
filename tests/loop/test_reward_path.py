"""The orchestrator's reward path without processes: what a reward rank is sent, how its verdicts merge into the
samples the ledger kept, and that a sample whose scoring keeps failing stops the job instead of going round forever."""

from __future__ import annotations

import pickle
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest

from hetrl.control.protocol import RewardDone, RewardWork, RolloutDone, ScoredSample, ScoringView
from hetrl.loop import orchestrator as orchestrator_module
from hetrl.loop.orchestrator import MAX_SCORING_FAILURES, Orchestrator, _Ledger
from hetrl.records import CONVERSATION_KEY, EpisodeItem, Sample

ENGINE, REWARDS = 1, [2, 3]
PROMPT, COMPLETION, LAYERS, TOP_K = 16, 32, 2, 2


def _orchestrator(monkeypatch, reads_completion_ids: bool = False) -> tuple[Orchestrator, list]:
    """An orchestrator with one engine and two reward workers; every send recorded as (message, rank)."""
    sent: list = []
    monkeypatch.setattr(orchestrator_module, "send", lambda world, message, rank, tag: sent.append((message, rank)))
    orch = Orchestrator.__new__(Orchestrator)
    orch.ctx, orch.monitor = SimpleNamespace(world=None), None
    orch.cfg = SimpleNamespace(
        algorithm=SimpleNamespace(group_size=2), reward=SimpleNamespace(reads_completion_ids=reads_completion_ids)
    )
    orch.ledger = _Ledger()
    orch.engines, orch.reward_ranks = [ENGINE], list(REWARDS)
    orch.engine_load, orch.reward_load = {ENGINE: 0}, dict.fromkeys(REWARDS, 0)
    orch.groups, orch.results, orch.ready, orch.purpose_of = defaultdict(list), defaultdict(list), [], {"t0": "train"}
    orch._train_groups_open, orch._reward_s = 1, defaultdict(float)
    return orch, sent


def _sample(index: int) -> Sample:
    """A routed (MoE) multimodal episode, with everything a reward rank must not be sent."""
    return Sample(
        f"t0.{index}",
        "t0",
        "shapes",
        list(range(PROMPT)),
        list(range(COMPLETION)),
        [1] * COMPLETION,
        [-0.5] * COMPLETION,
        [0] * COMPLETION,
        prompt_text="What colour?",
        completion_text="red",
        answer="red",
        flags=["env/flag"],
        info={CONVERSATION_KEY: [{"role": "user", "content": "What colour?"}], "env_wait_s": 0.1},
        images=[b"\x89PNG" + bytes(4096)],
        routed_experts=np.zeros((PROMPT + COMPLETION - 1, LAYERS, TOP_K), np.uint8),
    )


def _generated(orch: Orchestrator, samples: list[Sample]) -> None:
    for s in samples:
        orch.ledger.dispatched[s.sample_id] = EpisodeItem(s.sample_id, s.group_id, None, 0)
        orch.ledger.at_engine[s.sample_id] = ENGINE
        orch.ledger.issued.add(s.sample_id)
    orch.engine_load[ENGINE] = len(samples)
    orch._on_rollout(RolloutDone(samples), ENGINE)


def test_a_reward_rank_is_sent_what_the_rubric_reads_and_its_verdicts_merge_into_the_kept_samples(monkeypatch):
    orch, sent = _orchestrator(monkeypatch)
    samples = [_sample(0), _sample(1)]
    _generated(orch, samples)
    [(work, worker)] = sent
    assert isinstance(work, RewardWork) and [v.sample_id for v in work.views] == ["t0.0", "t0.1"]
    view = work.views[0]
    assert view.completion_ids is None and view.num_completion_tokens == COMPLETION
    assert view.info == {CONVERSATION_KEY: samples[0].info[CONVERSATION_KEY]}  # env info stays behind
    assert not hasattr(view, "routed_experts") and not hasattr(view, "images") and not hasattr(view, "logprobs")
    assert len(pickle.dumps(work)) < len(pickle.dumps(samples)) / 4

    verdict = ScoredSample("t0.0", {"math": 1.0}, 1.0, ["hack/none"], {"judge/failed_frac": 0.0})
    orch._on_reward(RewardDone([verdict], score_s=2.0), worker)
    kept = orch.groups["t0"][0]
    assert kept is samples[0] and kept.reward == 1.0 and kept.rewards == {"math": 1.0}
    assert kept.flags == ["env/flag", "hack/none"] and kept.info["reward_metrics"] == {"judge/failed_frac": 0.0}
    assert CONVERSATION_KEY not in kept.info and kept.routed_experts is not None and kept.images
    assert orch._reward_s["t0.0"] == 2.0 and orch.reward_load[worker] == 1

    with pytest.raises(RuntimeError, match="unknown or duplicate sample t0.0"):  # at most once
        orch._on_reward(RewardDone([verdict]), worker)


def test_the_token_ids_travel_only_for_a_rubric_that_reads_them(monkeypatch):
    orch, sent = _orchestrator(monkeypatch, reads_completion_ids=True)
    _generated(orch, [_sample(0)])
    assert sent[0][0].views[0].completion_ids == list(range(COMPLETION))


def test_a_sample_failed_again_and_again_stops_the_job_naming_it_and_the_workers(monkeypatch):
    """Today's loop sent it back forever (each round ticking liveness, so no watchdog fired)."""
    orch, sent = _orchestrator(monkeypatch)
    _generated(orch, [_sample(0), _sample(1)])
    workers = []
    with pytest.raises(RuntimeError, match=r"sample t0.0 failed scoring 3 times in a row, on reward\[0\].*reward\[1\]"):
        for _ in range(10 * MAX_SCORING_FAILURES):
            worker = sent[-1][1]  # where t0.0 was sent last
            workers.append(worker)
            orch._on_reward(RewardDone([], failed=["t0.0"]), worker)
    assert len(workers) == MAX_SCORING_FAILURES and workers[1] != workers[0]  # each retry went to the other worker
    assert orch.ledger.requeued_reward == MAX_SCORING_FAILURES - 1


def test_a_retry_that_scores_clears_the_sample_failures(monkeypatch):
    orch, sent = _orchestrator(monkeypatch)
    _generated(orch, [_sample(0)])
    for _ in range(MAX_SCORING_FAILURES - 1):
        orch._on_reward(RewardDone([], failed=["t0.0"]), sent[-1][1])
    orch._on_reward(RewardDone([ScoredSample("t0.0", {}, 0.5, [], {})]), sent[-1][1])
    assert not orch.ledger.scoring_failures and not orch.ledger.rewarding
    with pytest.raises(RuntimeError, match="failed unknown or already scored sample t0.0"):
        orch._on_reward(RewardDone([], failed=["t0.0"]), sent[-1][1])


def test_a_view_reads_as_its_sample_for_every_reward_function():
    from hetrl.config.reward import RewardConfig  # reason: the full rubric is only this test's concern
    from hetrl.reward.rubric import Rubric

    config = RewardConfig(
        functions=[
            {"name": "closeness", "kwargs": {"scale": 10}},
            {"name": "overlong", "kwargs": {"max_tokens": 40, "buffer_tokens": 16}},
            {"name": "length", "kwargs": {"target_tokens": 8}},
            {"name": "repetition"},
            {"name": "format"},
        ]
    )
    sample = _sample(0)
    sample.completion_text, sample.answer = "<answer>3</answer>", "4"
    rubric = Rubric.from_config(config)
    view = ScoringView.of(sample, with_completion_ids=config.reads_completion_ids)
    assert rubric.score(view) == rubric.score(sample)
    assert config.reads_completion_ids and not RewardConfig(functions=[{"name": "length"}]).reads_completion_ids
