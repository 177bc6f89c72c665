"""The orchestrator's reward path without processes: it names each engine's reward rank, merges the verdicts into
the samples' metadata (a verdict may overtake its sample's RolloutDone), has the holding engine send a failed sample
to another worker, and stops the job on a sample whose scoring keeps failing instead of going round forever. What a
reward rank is sent (a ScoringView, from the engine) is tested in test_rollout_round."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import numpy as np
import pytest

from hetrl.control.protocol import RescoreSamples, RewardDone, RolloutDone, RolloutWork, ScoredSample, ScoringView
from hetrl.loop.orchestrator import MAX_SCORING_FAILURES, Orchestrator
from hetrl.records import CONVERSATION_KEY, EpisodeItem, Sample, SampleMeta
from tests.loop.orchestrator_rig import bare_orchestrator

ENGINE, REWARDS = 1, [2, 3]
PROMPT, COMPLETION, LAYERS, TOP_K = 16, 32, 2, 2


def _orchestrator(monkeypatch) -> tuple[Orchestrator, list]:
    """One engine, two reward workers, one training group of two samples dispatched."""
    cfg = SimpleNamespace(algorithm=SimpleNamespace(group_size=2))
    orch, sent = bare_orchestrator(monkeypatch, cfg, [ENGINE], REWARDS)
    orch.dispatch([[EpisodeItem(f"t0.{i}", "t0", None, 0) for i in range(2)]], "train")
    orch._train_groups_open = 1
    return orch, sent


def _sample(index: int) -> Sample:
    """A routed (MoE) multimodal episode, with everything the orchestrator must not be sent."""
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


def test_the_engine_is_told_its_reward_rank_and_the_verdicts_merge_into_the_metadata(monkeypatch):
    orch, sent = _orchestrator(monkeypatch)
    [work] = sent
    assert isinstance(work, RolloutWork) and work.reward_rank in REWARDS
    assert orch.reward_load[work.reward_rank] == 2  # charged with both samples before they are generated
    samples = [_sample(0), _sample(1)]
    metas = [SampleMeta.of(s) for s in samples]
    assert len(pickle.dumps(metas)) < len(pickle.dumps(samples)) / 20
    orch._on_rollout(RolloutDone(metas), ENGINE)
    assert orch.ledger.held_at == {"t0.0": ENGINE, "t0.1": ENGINE}

    verdict = ScoredSample("t0.0", {"math": 1.0}, 1.0, ["hack/none"], {"judge/failed_frac": 0.0})
    orch._on_reward(RewardDone([verdict], score_s=2.0), work.reward_rank)
    kept = orch.groups["t0"][0]
    assert kept is metas[0] and kept.reward == 1.0 and kept.rewards == {"math": 1.0}
    assert kept.flags == ["env/flag", "hack/none"] and kept.info["reward_metrics"] == {"judge/failed_frac": 0.0}
    assert orch._reward_s["t0.0"] == 2.0 and orch.reward_load[work.reward_rank] == 1

    with pytest.raises(RuntimeError, match="unknown or duplicate sample t0.0"):  # at most once
        orch._on_reward(RewardDone([verdict]), work.reward_rank)


def test_a_verdict_that_overtakes_its_rollout_done_waits_for_it(monkeypatch):
    """Engine -> reward -> orchestrator may arrive before engine -> orchestrator: MPI orders one pair only."""
    orch, sent = _orchestrator(monkeypatch)
    worker = sent[0].reward_rank
    orch._on_reward(RewardDone([ScoredSample(f"t0.{i}", {}, float(i), [], {}) for i in range(2)]), worker)
    assert not orch.ready and set(orch._early) == {"t0.0", "t0.1"}
    orch._on_rollout(RolloutDone([SampleMeta.of(_sample(0)), SampleMeta.of(_sample(1))]), ENGINE)
    assert [[m.reward for m in group] for group in orch.ready] == [[0.0, 1.0]] and not orch._early
    assert orch.reward_load == dict.fromkeys(REWARDS, 0)


def test_a_failed_sample_is_sent_by_its_engine_to_another_worker_and_stops_the_job_after_repeated_failures(
    monkeypatch,
):
    """Today's loop sent it back forever (each round ticking liveness, so no watchdog fired)."""
    orch, sent = _orchestrator(monkeypatch)
    orch._on_rollout(RolloutDone([SampleMeta.of(_sample(0)), SampleMeta.of(_sample(1))]), ENGINE)
    workers = [sent[0].reward_rank]
    with pytest.raises(RuntimeError, match=r"sample t0.0 failed scoring 3 times in a row, on reward\[.\].*reward\[.\]"):
        for _ in range(10 * MAX_SCORING_FAILURES):
            orch._on_reward(RewardDone([], failed=["t0.0"]), workers[-1])
            again = sent[-1]
            assert isinstance(again, RescoreSamples) and again.sample_ids == ["t0.0"]
            workers.append(again.reward_rank)
    assert len(workers) == MAX_SCORING_FAILURES and workers[1] != workers[0]  # each retry went to the other worker
    assert orch.ledger.requeued_reward == MAX_SCORING_FAILURES - 1


def test_a_retry_that_scores_clears_the_sample_failures(monkeypatch):
    orch, sent = _orchestrator(monkeypatch)
    orch._on_rollout(RolloutDone([SampleMeta.of(_sample(0))]), ENGINE)
    worker = sent[0].reward_rank
    for _ in range(MAX_SCORING_FAILURES - 1):
        orch._on_reward(RewardDone([], failed=["t0.0"]), worker)
        worker = sent[-1].reward_rank
    orch._on_reward(RewardDone([ScoredSample("t0.0", {}, 0.5, [], {})]), worker)
    assert not orch.ledger.scoring_failures and not orch.ledger.rewarding
    with pytest.raises(RuntimeError, match="failed unknown or already scored sample t0.0"):
        orch._on_reward(RewardDone([], failed=["t0.0"]), worker)


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
    assert ScoringView.of(sample, True).completion_ids == list(range(COMPLETION))
    view = ScoringView.of(sample, False)
    assert view.completion_ids is None and view.info == {CONVERSATION_KEY: sample.info[CONVERSATION_KEY]}
    assert not hasattr(view, "routed_experts") and not hasattr(view, "images") and not hasattr(view, "logprobs")
