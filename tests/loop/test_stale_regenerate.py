"""schedule.stale_policy=regenerate: a stale group is generated again, never dropped.

End to end, staleness is provoked in a sync run (bound 0) by an engine refusing the push of v1:
the orchestrator dispatches step 1 right after step 0 (tens of ms) while the push takes ~0.2 s, so
the engine starts step 1's groups with v0 before the resend reaches it. The orchestrator must
generate them again, under the same sample ids, by v1: nothing dropped, something regenerated,
every id trained once, and no trained sample older than the bound. The same accounting is also
checked without processes, on the orchestrator's own dispatch and result handling with the
messages faked, where which generation is stale is chosen, not timed.
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from hetrl.control.protocol import DropSamples, RolloutWork
from hetrl.loop.orchestrator import Orchestrator
from hetrl.monitor import names
from hetrl.monitor.sinks import read_jsonl
from hetrl.records import Sample
from tests.loop.orchestrator_rig import bare_orchestrator, finish

ROOT = Path(__file__).resolve().parents[2]
STEPS, PROMPTS, GROUP_SIZE = 3, 2, 4
ENGINE, REWARD = 1, 2


class _Stream:
    """Task ``cursor`` is ``("task<cursor>", 100 + cursor)``, as ``TaskStream.at`` would name it."""

    def __init__(self) -> None:
        self.cursor = 0

    def at(self, cursor: int) -> tuple[str, int]:
        return f"task{cursor}", 100 + cursor

    def next(self) -> tuple[str, int]:
        self.cursor += 1
        return self.at(self.cursor - 1)

    def state_dict(self) -> dict[str, int]:
        return {"cursor": self.cursor}


def _orchestrator(monkeypatch, stale_policy: str, version: int) -> tuple[Orchestrator, list]:
    """An orchestrator without processes: one engine, one reward worker, every send recorded."""
    cfg = SimpleNamespace(
        run=SimpleNamespace(prompts_per_step=2),
        schedule=SimpleNamespace(stale_policy=stale_policy),
        algorithm=SimpleNamespace(group_size=2, resolved_dynamic_sampling=False),
        reward=SimpleNamespace(reads_completion_ids=False),
    )
    orch, sent = bare_orchestrator(monkeypatch, cfg, [ENGINE], [REWARD], version)
    orch.stream = _Stream()
    return orch, sent


def _generate_with(orch: Orchestrator, sent: list, versions: list[int]):
    """A pump that completes the next group the engine was sent, its tokens sampled by ``versions.pop(0)``."""
    queue: list = []  # EpisodeItems sent to the engine, in order
    seen = 0

    def pump(waiting_for: str, timeout_s: float | None = None) -> None:
        nonlocal seen
        for message in sent[seen:]:
            if isinstance(message, RolloutWork):
                queue.extend(message.items)
        seen = len(sent)
        group = [item for item in queue if item.group_id == queue[0].group_id]
        queue[:] = [item for item in queue if item not in group]
        version = versions.pop(0)
        samples = [
            Sample(i.sample_id, i.group_id, f"{i.task}/{i.seed}", [1], [7], [1], [0.0], [version]) for i in group
        ]
        finish(orch, ENGINE, REWARD, samples, score_s=1.0)

    return pump


def _items_sent(sent: list) -> list:
    return [item for message in sent if isinstance(message, RolloutWork) for item in message.items]


@pytest.mark.parametrize("stale_policy", ["regenerate", "drop"])
def test_collect_batch_regenerates_a_stale_group_under_its_ids(monkeypatch, stale_policy):
    orch, sent = _orchestrator(monkeypatch, stale_policy, version=3)
    orch.pump = _generate_with(orch, sent, versions=[1, 3, 3])  # t0's first generation is 2 versions old
    orch.top_up(2)
    batch, dropped_stale, _ = orch.collect_batch(max_lag=1, target_groups=2)
    items = _items_sent(sent)
    assert [i.sample_id for i in items[:4]] == ["t0.0", "t0.1", "t1.0", "t1.1"]
    # The stale samples are forgotten by their engine (dropped, or before their ids are generated again).
    drops = [m.sample_ids for m in sent if isinstance(m, DropSamples)]
    assert drops == [["t0.0", "t0.1"]]
    if stale_policy == "regenerate":  # before the same ids go out again
        drop_at = next(k for k, m in enumerate(sent) if isinstance(m, DropSamples))
        again_at = max(k for k, m in enumerate(sent) if isinstance(m, RolloutWork) and m.items[0].group_id == "t0")
        assert drop_at < again_at
    orch.ledger.trained.update(s.sample_id for g in batch for s in g)  # as Orchestrator.train does
    report = orch.ledger_report()
    if stale_policy == "drop":  # as before: a new task (t2) in its place
        assert dropped_stale == 2 and report["dropped"] == 2 and report["regenerated"] == 0 and report["trained"] == 4
        assert sorted(g[0].group_id for g in batch) == ["t1", "t2"] and orch.stream.cursor == 3
        return
    assert items[4:] == items[:2]  # t0 again: the same ids, task and episode seeds
    assert sorted(g[0].group_id for g in batch) == ["t0", "t1"] and all(s.min_version == 3 for g in batch for s in g)
    assert dropped_stale == 0 and orch.stream.cursor == 2  # no task drawn in its place
    assert orch.take_regenerated() == 2 and orch.take_regenerated() == 0
    assert report == {
        "issued": 4,
        "trained": 4,
        "dropped": 0,
        "in_flight": 0,
        "regenerated": 2,
        "requeued_generation": 0,
        "requeued_reward": 0,
    }
    assert orch.outstanding_groups() == 0 and orch.engine_load == {ENGINE: 0}
    assert orch._reward_s == {"t0.0": 0.5, "t0.1": 0.5, "t1.0": 0.5, "t1.1": 0.5}  # the stale scoring is not charged
    assert orch.state_dict()["regenerated"] == 2


@pytest.mark.mpi
@pytest.mark.vllm
def test_a_stale_group_is_generated_again_under_its_ids(tmp_path):
    cmd = [
        sys.executable,
        str(ROOT / "launch.py"),
        "recipe=tiny_grpo",
        f"run.output_dir={tmp_path}",
        f"run.steps={STEPS}",
        f"run.prompts_per_step={PROMPTS}",
        f"algorithm.group_size={GROUP_SIZE}",
        "warm_start.steps=0",
        "eval.num_tasks=1",
        "eval.k=1",
        "checkpoint.every=0",
        "schedule.type=sync",
        "schedule.stale_policy=regenerate",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HETRL_INJECT_FAULT": "rollout:0:push_refused@1"}
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "tiny_grpo"
    summary = json.loads((run_dir / "summary.json").read_text())
    samples = summary["samples"]
    assert summary["refused_weight_pushes"] == 1, summary
    assert samples["regenerated"] > 0 and samples["regenerated"] % GROUP_SIZE == 0, samples
    assert samples["dropped"] == 0 and summary["dropped_stale_samples"] == 0, samples
    assert samples["trained"] == STEPS * PROMPTS * GROUP_SIZE, samples
    # Regenerated groups keep their ids: no more were issued than trained and still in flight.
    assert samples["issued"] == samples["trained"] + samples["in_flight"], samples
    steps = read_jsonl(run_dir / "metrics.jsonl")
    assert sorted(steps) == list(range(STEPS))
    assert sum(m[names.STALENESS_REGENERATED] for m in steps.values()) == samples["regenerated"]
    assert all(m[names.STALENESS_DROPPED] == 0 for m in steps.values())
    assert max(m[names.STALENESS_MAX] for m in steps.values()) == 0  # the bound of sync
    # Every trained id once (the rollout store holds each step's trained samples).
    from hetrl.monitor.rollout_store import RolloutReader

    ids = [row.sample_id for row in RolloutReader(run_dir).rows()]
    assert len(ids) == len(set(ids)) == samples["trained"]
