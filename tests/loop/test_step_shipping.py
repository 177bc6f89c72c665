"""How the orchestrator sends a step to the trainer: each holder ships each replica its samples (never through the
orchestrator, never to another replica), the header carries only what the trainer reads, and every sample leaves
its holder exactly once."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

from hetrl.control.protocol import TRAIN_FIELDS, ShipSamples, TrainerLayout, TrainShard, TrainWork
from hetrl.records import Sample, SampleMeta
from hetrl.trainer.shards import step_shards
from tests.loop.orchestrator_rig import bare_orchestrator

ENGINES, RECEIVERS = [1, 2], [10, 12]


def _sample(group: int, index: int, completion: int) -> Sample:
    sample_id = f"t{group}.{index}"
    return Sample(
        sample_id,
        f"t{group}",
        "toy",
        [1, 2, 3],
        [4] * completion,
        [1] * completion,
        [-0.5] * completion,
        [0] * completion,
        reward=float(index),
        info={"stop_reason": "done"},
    )


def _step(monkeypatch):
    cfg = SimpleNamespace(trainer=SimpleNamespace(updates_per_batch=2))
    orch, sent = bare_orchestrator(monkeypatch, cfg, ENGINES, [3])
    orch.layout = TrainerLayout(RECEIVERS, None, shared_prompts=False)
    samples = [_sample(g, i, 5 + 3 * g + i) for g in range(3) for i in range(2)]
    metas = [SampleMeta.of(s) for s in samples]
    for k, meta in enumerate(metas[:4]):  # two engines hold four samples, the orchestrator two demonstrations
        orch.ledger.held_at[meta.sample_id] = ENGINES[k % 2]
    for sample in samples[4:]:
        orch.hold(sample)
    return orch, sent, samples, metas


def test_each_holder_ships_each_replica_its_dealt_samples_once(monkeypatch):
    orch, sent, samples, metas = _step(monkeypatch)
    orch._ship(7, metas, num_minibatches=2)
    shards = step_shards(metas, 2, len(RECEIVERS))
    dealt = {receiver: {metas[i].sample_id for i in shard} for receiver, shard in zip(RECEIVERS, shards)}
    got: dict[int, list[str]] = {receiver: [] for receiver in RECEIVERS}
    by_id = {m.sample_id: m for m in metas}
    for message in sent:
        if isinstance(message, ShipSamples):  # to an engine: its part of each replica's shard, with the verdicts
            assert message.step == 7
            for receiver, part in message.shards:
                got[receiver] += [m.sample_id for m in part]
                assert all(m is by_id[m.sample_id] for m in part)  # the metas themselves: their verdicts
        else:
            assert isinstance(message, TrainShard) and message.step == 7  # the orchestrator's own, scored
            receiver = next(r for r, ids in dealt.items() if message.samples[0].sample_id in ids)
            got[receiver] += [s.sample_id for s in message.samples]
    assert {r: sorted(ids) for r, ids in got.items()} == {r: sorted(ids) for r, ids in dealt.items()}
    assert sum(map(len, got.values())) == len(metas)  # each sample once
    assert sum(isinstance(m, ShipSamples) for m in sent) == len(ENGINES)  # one message per engine
    assert not orch.ledger.held_at and not orch._held
    with pytest.raises(RuntimeError, match="no rank holds samples"):  # shipped samples are gone: at most once
        orch._ship(8, metas, num_minibatches=2)


def test_the_header_carries_what_the_trainer_reads_in_few_bytes(monkeypatch):
    _, _, _, metas = _step(monkeypatch)
    work = TrainWork.of(3, metas)
    back = work.metas
    assert [tuple(getattr(m, f) for f in TRAIN_FIELDS) for m in back] == [
        tuple(getattr(m, f) for f in TRAIN_FIELDS) for m in metas
    ]
    assert step_shards(back, 2, 2) == step_shards(metas, 2, 2)  # the trainer deals the step as the orchestrator
    many = [SampleMeta.of(_sample(g, i, 100 + i)) for g in range(200) for i in range(6)]
    per_sample = len(pickle.dumps(TrainWork.of(3, many))) / len(many)
    assert per_sample < len(pickle.dumps(many)) / len(many) / 2 and per_sample < 60
