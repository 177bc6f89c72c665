import pytest

from hetrl.config.reward import RewardConfig
from hetrl.reward import ResultTable, RewardOutcome, RewardWorker, Rubric
from hetrl.types import Sample


def sample(i, text):
    return Sample(f"s{i}", "g", "t", [1], [2] * (i + 1), [1] * (i + 1), [0.0] * (i + 1), [0] * (i + 1), completion_text=text)


def test_score_batch_tags_results_in_order():
    rubric = Rubric.from_config(RewardConfig(functions=[{"name": "format", "weight": 1.0}, {"name": "length", "weight": 0.0, "kwargs": {"target_tokens": 2}}]))
    worker = RewardWorker(rubric, concurrency=3)
    samples = [sample(i, "<think>t</think> \\boxed{1}" if i % 2 else "no format") for i in range(6)]
    results = worker.score_batch(samples)
    worker.close()
    assert [sid for sid, _ in results] == [s.sample_id for s in samples]
    assert [o.total for _, o in results] == [0.0, 1.0] * 3
    assert results[5][1].per_source["length"] == pytest.approx(-2.0)  # zero-weight metric: computed, not in the total
    applied = results[1][1].apply_to(samples[1])
    assert applied.reward == 1.0 and applied.rewards["format"] == 1.0


def test_crashed_worker_items_are_retried_once():
    table = ResultTable()
    for i in range(4):
        table.assign(f"s{i}", "w0" if i < 2 else "w1")
    assert table.record("s2", RewardOutcome(1.0))
    lost = table.worker_failed("w1")  # w1 died with s3 unfinished
    assert lost == ["s3"] and set(table.pending()) == {"s0", "s1"}
    table.assign("s3", "w0")
    assert table.record("s3", RewardOutcome(0.5))
    assert not table.record("s3", RewardOutcome(0.9))  # w1's late answer is ignored, never double-counted
    assert table.duplicates == 1 and table.result("s3").total == 0.5 and len(table) == 2
    with pytest.raises(ValueError, match="double-count"):
        table.assign("s2", "w0")


def test_unknown_reward_name_is_refused():
    with pytest.raises(ValueError, match="did you mean 'format'"):
        RewardConfig(functions=[{"name": "fromat"}])


def test_failing_source_is_flagged_not_raised():
    def broken(s):
        raise RuntimeError("boom")

    from hetrl.reward.rubric import WeightedFn

    out = Rubric([WeightedFn("ok", lambda s: 1.0, 1.0), WeightedFn("bad", broken, 1.0)]).score(sample(0, "x"))
    assert out.total == 1.0 and "reward/error:bad" in out.flags and out.per_source["bad"] == 0.0
