import threading
import time

import pytest

from hetrl.config.reward import RewardConfig
from hetrl.monitor import names
from hetrl.records import Sample
from hetrl.reward import ConcurrentScorer, Rubric
from hetrl.reward.base import ScoringUnavailable
from hetrl.reward.rubric import WeightedFn


def sample(i, text):
    return Sample(
        f"s{i}", "g", "t", [1], [2] * (i + 1), [1] * (i + 1), [0.0] * (i + 1), [0] * (i + 1), completion_text=text
    )


def drain(scorer, expected, timeout_s=10.0):
    done, failed = [], []
    deadline = time.monotonic() + timeout_s
    while len(done) + len(failed) < expected:
        assert time.monotonic() < deadline, "the scorer did not finish in time"
        scorer.wake.wait(0.05)
        got, lost = scorer.finished()
        done += got
        failed += lost
    return done, failed


def test_scores_every_sample_with_the_rubric():
    rubric = Rubric.from_config(
        RewardConfig(
            functions=[
                {"name": "format", "weight": 1.0},
                {"name": "length", "weight": 0.0, "kwargs": {"target_tokens": 2}},
            ]
        )
    )
    scorer = ConcurrentScorer(rubric, concurrency=3)
    for i in range(6):
        scorer.submit(sample(i, "<think>t</think> \\boxed{1}" if i % 2 else "no format"))
    done, failed = drain(scorer, 6)
    scorer.close()
    by_id = {s.sample_id: s for s in done}
    assert not failed and sorted(by_id) == [f"s{i}" for i in range(6)]
    assert [by_id[f"s{i}"].reward for i in range(6)] == [0.0, 1.0] * 3
    assert by_id["s5"].rewards["length"] == pytest.approx(-2.0)  # zero-weight metric: computed, not in the total


def test_samples_are_scored_at_once_and_stream_out_as_they_finish():
    all_running, release = threading.Barrier(4, timeout=5), threading.Event()

    def slow(s):
        all_running.wait()  # only passes once 4 samples are being scored together
        if s.sample_id != "s0":
            release.wait(5)
        return 1.0

    scorer = ConcurrentScorer(Rubric([WeightedFn("slow", slow, 1.0)]), concurrency=4)
    for i in range(4):
        scorer.submit(sample(i, "x"))
    first, failed = drain(scorer, 1)
    assert (
        not failed and [s.sample_id for s in first] == ["s0"] and scorer.in_flight == 3
    )  # out before the others finish
    release.set()
    rest, failed = drain(scorer, 3)
    scorer.close()
    assert not failed and len(rest) == 3


def test_a_source_whose_served_model_never_answered_scores_the_sample_0_flagged():
    """After reward.server.max_attempts the client raises ScoringUnavailable: the sample is answered (0, flagged,
    counted), never failed back to the orchestrator, which would send it again and again."""

    def unanswered(s):
        raise ScoringUnavailable("no judge answered")

    scorer = ConcurrentScorer(
        Rubric([WeightedFn("ok", lambda s: 1.0, 1.0), WeightedFn("judge", unanswered, 1.0)]), concurrency=2
    )
    scorer.submit(sample(0, "x"))
    done, failed = drain(scorer, 1)
    scorer.close()
    assert not failed and scorer.in_flight == 0 and [s.sample_id for s in done] == ["s0"]
    assert done[0].reward == 0.0 and done[0].rewards == {"ok": 1.0, "judge": 0.0}  # the other source cannot pay
    assert done[0].flags == ["reward/unavailable:judge"] and done[0].metrics["reward/unavailable_frac"] == 1.0
    assert names.spec_of("reward/unavailable_frac") is not None  # a documented metric: the step logs its mean


def test_a_rubric_whose_models_answer_reports_none_unavailable():
    out = Rubric([WeightedFn("ok", lambda s: 1.0, 1.0)]).score(sample(0, "x"))
    assert out.total == 1.0 and out.metrics["reward/unavailable_frac"] == 0.0 and not out.flags


def test_close_drops_the_samples_not_started():
    release = threading.Event()
    scorer = ConcurrentScorer(Rubric([WeightedFn("slow", lambda s: release.wait(5) and 1.0, 1.0)]), concurrency=1)
    for i in range(5):
        scorer.submit(sample(i, "x"))
    threading.Timer(0.2, release.set).start()
    start = time.monotonic()
    scorer.close()  # the one started finishes; the four queued never run
    assert time.monotonic() - start < 3 and scorer.in_flight == 0


def test_unknown_reward_name_is_refused():
    with pytest.raises(ValueError, match="did you mean 'format'"):
        RewardConfig(functions=[{"name": "fromat"}])


def test_failing_source_is_flagged_not_raised():
    def broken(s):
        raise RuntimeError("boom")

    out = Rubric([WeightedFn("ok", lambda s: 1.0, 1.0), WeightedFn("bad", broken, 1.0)]).score(sample(0, "x"))
    assert out.total == 1.0 and "reward/error:bad" in out.flags and out.per_source["bad"] == 0.0
