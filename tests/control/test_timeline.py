"""The timeline's records and what hetrl.plot makes of them (no MPI job: the writer of one process)."""

import json

import pytest

from hetrl.control import timeline
from hetrl.control.timeline import hop_latencies, phase_medians, read_timeline, step_windows


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """Three orchestrator steps (1 s each) and a rollout rank's spans and hops, written as the ranks would."""
    timeline.start(tmp_path, "orchestrator", 0)
    for step in range(3):
        timeline.record("collect batch", 100 + step, 100.6 + step)
        timeline.record("step", 100 + step, 101 + step, step=step)
    timeline.stop()
    timeline.start(tmp_path, "rollout", 0)
    for step in range(3):
        timeline.record("generate", 100.1 + step, 100.1 + step + 0.2 * (step + 1))  # 0.2, 0.4, 0.6 s
        monkeypatch.setattr(
            timeline.time, "time", lambda step=step: 100.01 + step
        )  # the hop arrives 10 ms after it was sent
        timeline.hop("RolloutWork", 0, sent=100 + step)
        monkeypatch.undo()
    timeline.stop()
    return tmp_path


def test_spans_and_hops_read_back_in_time_order(recorded):
    records = read_timeline(recorded)
    assert [r.t0 for r in records] == sorted(r.t0 for r in records)
    assert step_windows(records) == {0: (100, 101), 1: (101, 102), 2: (102, 103)}
    hop = next(r for r in records if r.source is not None)
    assert (hop.who, hop.name, hop.source) == ("rollout_0", "RolloutWork", 0)


def test_medians_skip_the_first_step(recorded):
    phases = phase_medians(read_timeline(recorded))
    assert phases["rollout_0: generate"] == pytest.approx(0.5)  # median of 0.4 and 0.6; step 0's 0.2 is skipped
    assert phases["orchestrator_0: step"] == pytest.approx(1.0)
    latency, per_step = hop_latencies(read_timeline(recorded))["RolloutWork -> rollout_0"]
    assert latency == pytest.approx(0.01) and per_step == 1


def test_a_span_is_recorded_even_when_its_block_raises_and_nothing_without_a_writer(tmp_path):
    with timeline.span("nothing recorded"):  # no writer started: a no-op
        pass
    timeline.start(tmp_path, "trainer", 0)
    with pytest.raises(ValueError), timeline.span("log-probs"):
        raise ValueError("the time was spent all the same")
    timeline.stop()
    (line,) = (tmp_path / "timeline" / "trainer_0.jsonl").read_text().splitlines()
    assert json.loads(line)["span"] == "log-probs"


def test_a_line_cut_short_is_skipped(recorded):
    with open(recorded / "timeline" / "rollout_0.jsonl", "a") as f:
        f.write('{"span": "gener')
    assert len(read_timeline(recorded)) == 3 * 2 + 3 * 2
