"""How a trainer rank takes the orchestrator's messages: model and transport are stand-ins, the dispatch is real."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hetrl.control.comm import Tag
from hetrl.control.protocol import PushWeights, Restore, Restored, RewardDone, Shutdown, TrainShard
from hetrl.control.role_loop import RoleLoop
from hetrl.loop import trainer_role
from hetrl.loop.trainer_role import TrainerRank, _Clock
from hetrl.records import Sample, SampleMeta


def _rank(monkeypatch, messages: list) -> tuple[TrainerRank, list]:
    """A trainer rank holding v2 that receives ``messages`` in order; what it pushes and replies is recorded."""
    done: list = []
    incoming = iter(messages)
    monkeypatch.setattr(trainer_role, "_next_message", lambda ctx: next(incoming))
    monkeypatch.setattr(
        trainer_role,
        "_push_weights",
        lambda ctx, trainer, cfg, sender, version, attempt=0: done.append((version, attempt)),
    )
    monkeypatch.setattr(trainer_role, "_reply", lambda ctx, sender, message: done.append(message))
    rank = TrainerRank.__new__(TrainerRank)  # no model, no optimizer: only the dispatch runs
    rank.ctx = SimpleNamespace(world=None, orchestrator_rank=0, role="trainer", assignment=SimpleNamespace(role_rank=0))
    rank.cfg = SimpleNamespace(warm_start=SimpleNamespace(steps=2))
    rank.trainer = rank.critic = rank.sender = rank.run_dir = rank.store = None
    rank.version, rank.stage, rank.clock = 2, "rl", _Clock()
    rank.loop = RoleLoop(rank.ctx, rank.handlers())
    return rank, done


def test_messages_go_to_their_handlers_in_order_until_shutdown(monkeypatch):
    restored = {"loop": {"warm_steps_done": 1}}
    monkeypatch.setattr(trainer_role, "_restore", lambda trainer, critic, path: (5, restored))
    rank, done = _rank(monkeypatch, [PushWeights(2, attempt=1), Restore("p"), Shutdown()])
    rank.serve()
    # the push again, then the restore's answer and its push at the checkpoint's version, in its warm-start stage
    assert done == [(2, 1), Restored(5, restored), (5, 0)] and rank.stage == "supervised"
    assert set(rank.clock.take()) == {"time/wait", "time/weight_sync"}


def test_a_push_again_of_another_version_stops_the_rank(monkeypatch):
    rank, _ = _rank(monkeypatch, [PushWeights(1, attempt=1)])
    with pytest.raises(RuntimeError, match="push v1 again, the trainer holds v2"):
        rank.serve()


def test_a_message_the_trainer_does_not_handle_names_it_and_the_sender(monkeypatch):
    rank, _ = _rank(monkeypatch, [RewardDone([])])
    with pytest.raises(TypeError, match=r"trainer\[0\] got an unexpected RewardDone from world rank 0"):
        rank.serve()


SAMPLES = [Sample(f"s{i}", f"g{i // 2}", "t", [1], [2, 3], [1, 1], [0.0, 0.0], [0, 0]) for i in range(6)]
METAS = [SampleMeta.of(s) for s in SAMPLES]


def _arriving(monkeypatch, arrivals: list[tuple[object, int]]) -> None:
    """``(message, source)`` on Tag.SHARD, one per poll, an empty poll before each (the receiver naps then)."""
    polls = [got for arrival in arrivals for got in (None, (*arrival, Tag.SHARD))]
    monkeypatch.setattr(trainer_role, "poll", lambda world, source=None, tag=None: polls.pop(0))
    monkeypatch.setattr(trainer_role.time, "sleep", lambda seconds: None)


def test_a_receiver_takes_its_shard_from_every_holder(monkeypatch):
    _arriving(monkeypatch, [(TrainShard(3, [SAMPLES[4]]), 7), (TrainShard(3, [SAMPLES[1], SAMPLES[5]]), 8)])
    shard = trainer_role.receive_shard(None, 3, METAS, [1, 4, 5], "the engines")
    assert shard == {1: SAMPLES[1], 4: SAMPLES[4], 5: SAMPLES[5]}


@pytest.mark.parametrize(
    ("arrivals", "error"),
    [
        ([(TrainShard(2, [SAMPLES[1]]), 7)], "world rank 7 sent step 2's shard while this replica waits for step 3's"),
        ([(Shutdown(), 7)], "world rank 7 sent Shutdown while this replica waits for step 3's"),
        ([(TrainShard(3, [SAMPLES[0]]), 8)], "world rank 8 sent sample s0 of step 3 which this replica does not train"),
        (
            [(TrainShard(3, [SAMPLES[1]]), 7), (TrainShard(3, [SAMPLES[1]]), 8)],
            "world rank 8 sent sample s1 of step 3 a second",
        ),
    ],
)
def test_a_part_of_another_step_or_replica_names_its_sender(monkeypatch, arrivals, error):
    _arriving(monkeypatch, arrivals)
    with pytest.raises(RuntimeError, match=error):
        trainer_role.receive_shard(None, 3, METAS, [1, 4], "the engines")
