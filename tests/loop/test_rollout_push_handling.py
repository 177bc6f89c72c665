"""How a rollout rank takes a weight push: engine and transport are stand-ins, the decisions are the real ones."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hetrl.control.protocol import MemoryReleased, PushRefused, ReleaseMemory, ServingWeights, SyncWeights
from hetrl.control.role_loop import RoleLoop
from hetrl.loop import rollout_role
from hetrl.loop.rollout_role import RolloutWorker
from hetrl.transport.weights import StagedWeights, shared_memory


class _Engine:
    broken = False

    def __init__(self, version: int) -> None:
        self.version = version
        self.loaded: list[int] = []
        self.asleep: set[str] = set()
        self.turns: list[str] = []  # sleeps, wakes and loads, in order

    def load_weights(self, staged: StagedWeights) -> None:
        assert "weights" not in self.asleep
        self.turns.append(f"load v{staged.version}")
        self.loaded.append(staged.version)
        self.version = staged.version

    def release_memory(self) -> None:
        self.turns.append("sleep")
        self.asleep = {"weights", "kv_cache"}

    def wake(self, tag: str) -> None:
        self.turns.append(f"wake {tag}")
        self.asleep.discard(tag)


class _Receiver:
    def __init__(self, staged: StagedWeights) -> None:
        self.staged = staged
        self.asked: list[tuple[int, int]] = []

    def receive(self, version: int, attempt: int) -> StagedWeights:
        self.asked.append((version, attempt))
        return self.staged


@pytest.fixture
def shm(tmp_path, monkeypatch):
    monkeypatch.setattr(shared_memory, "shared_memory_dir", lambda: tmp_path)
    return tmp_path


def _staged_in_shared_memory(version: int) -> StagedWeights:
    tensors = {"w": torch.arange(6, dtype=torch.float32)}
    path = shared_memory.write_push(tensors, version)
    return StagedWeights(version, dict(shared_memory.read_push(path)), shared_dir=path)


def _worker(monkeypatch, engine: _Engine, receiver: _Receiver, refuse: bool = False, retries: int = 1):
    sent: list = []
    monkeypatch.setattr(rollout_role, "send", lambda world, message, rank, tag: sent.append(message))
    worker = RolloutWorker.__new__(RolloutWorker)  # no vLLM engine, no tokenizer: only the push path runs
    worker.ctx = SimpleNamespace(world=None, orchestrator_rank=0)
    worker.cfg = SimpleNamespace(rollout=SimpleNamespace(weight_sync_retries=retries))
    worker.engine, worker.receiver, worker.refused_in_a_row, worker.last_push = engine, receiver, 0, None
    worker.refuse_push = SimpleNamespace(fire=lambda: refuse)
    worker.loop = RoleLoop(worker.ctx, worker.handlers(), source=0)
    return worker, sent


def test_a_loaded_push_is_the_send_asked_for_is_reported_and_resets_the_refusal_count(monkeypatch, shm):
    staged = _staged_in_shared_memory(3)
    receiver, engine = _Receiver(staged), _Engine(2)
    worker, sent = _worker(monkeypatch, engine, receiver)
    worker.refused_in_a_row = 1
    worker._sync_weights(SyncWeights(3, attempt=1))
    assert receiver.asked == [(3, 1)] and engine.loaded == [3] and sent == [ServingWeights(3)]
    assert worker.refused_in_a_row == 0 and worker.last_push.version == 3
    assert not list(shm.iterdir())  # the stand-in engine does not remove it: the rank does


def test_a_push_the_engine_already_serves_is_skipped_and_its_shared_memory_freed(monkeypatch, shm):
    engine = _Engine(3)
    worker, sent = _worker(monkeypatch, engine, _Receiver(_staged_in_shared_memory(3)))
    worker._sync_weights(SyncWeights(3, attempt=1))  # sent again for another engine's sake
    # Answered all the same: the orchestrator bounds a push by every engine's answer.
    assert engine.loaded == [] and sent == [ServingWeights(3)] and not list(shm.iterdir())


def test_a_refused_push_is_reported_freed_and_stops_the_job_past_the_retries(monkeypatch, shm):
    engine = _Engine(2)
    worker, sent = _worker(monkeypatch, engine, _Receiver(_staged_in_shared_memory(3)), refuse=True, retries=1)
    worker._sync_weights(SyncWeights(3, attempt=0))
    assert engine.version == 2 and not list(shm.iterdir())
    assert len(sent) == 1 and isinstance(sent[0], PushRefused) and (sent[0].version, sent[0].attempt) == (3, 0)
    assert "injected fault" in sent[0].reason
    worker.receiver = _Receiver(_staged_in_shared_memory(3))
    with pytest.raises(RuntimeError, match="refused 2 weight pushes in a row"):
        worker._sync_weights(SyncWeights(3, attempt=1))
    assert not list(shm.iterdir())


def test_a_colocated_engine_sleeps_when_told_and_wakes_its_weights_for_the_push_then_its_kv_cache(monkeypatch, shm):
    engine = _Engine(2)
    worker, sent = _worker(monkeypatch, engine, _Receiver(_staged_in_shared_memory(3)))
    worker.loop.handle(ReleaseMemory(), 0)
    assert engine.turns == ["sleep"] and sent == [MemoryReleased()]
    worker.loop.handle(SyncWeights(3), 0)
    assert engine.turns == ["sleep", "wake weights", "load v3", "wake kv_cache"] and not engine.asleep
    assert sent[1:] == [ServingWeights(3)]
    worker.loop.handle(SyncWeights(3, attempt=1), 0)  # sent again for another engine's sake: awake, nothing to wake
    assert engine.turns[4:] == [] and not list(shm.iterdir())


def test_a_push_refused_while_asleep_still_wakes_the_kv_cache(monkeypatch, shm):
    """The engine then serves its old weights, as an engine that never slept would."""
    engine = _Engine(2)
    worker, sent = _worker(monkeypatch, engine, _Receiver(_staged_in_shared_memory(3)), refuse=True)
    worker.loop.handle(ReleaseMemory(), 0)
    worker.loop.handle(SyncWeights(3), 0)
    assert engine.turns == ["sleep", "wake weights", "wake kv_cache"] and not engine.asleep
    assert isinstance(sent[-1], PushRefused) and engine.version == 2
