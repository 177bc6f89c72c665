"""A rollout rank's round of the role loop: episodes and engine are stand-ins, the order is the real one."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from hetrl.control.protocol import RolloutDone, RolloutWork, Shutdown
from hetrl.control.role_loop import RoleLoop
from hetrl.loop import rollout_role
from hetrl.loop.rollout_role import RolloutWorker


class _Engine:
    """Records how many turns had been submitted when each decoding step began."""

    asleep: set[str] = set()
    version = 0

    def __init__(self) -> None:
        self.submitted: list[str] = []
        self.steps: list[int] = []

    def has_work(self) -> bool:
        return bool(self.submitted)

    def poll(self) -> list:
        self.steps.append(len(self.submitted))
        return []

    def shutdown(self) -> None:
        pass


class _Episodes:
    """Each started episode submits its first turn when the event loop first runs it, as a real one does."""

    def __init__(self, engine: _Engine) -> None:
        self.engine = engine
        self.finished: list[str] = []
        self.held = 0

    def __len__(self) -> int:
        return self.held

    def start(self, item: str, sampling: object) -> None:
        self.held += 1
        asyncio.get_running_loop().create_task(self._turn(item))

    async def _turn(self, item: str) -> None:
        self.engine.submitted.append(item)

    def take(self) -> tuple[list[str], list[str]]:
        finished, self.finished = self.finished, []
        return finished, []


def _worker(monkeypatch) -> tuple[RolloutWorker, _Engine, list]:
    sent: list = []
    monkeypatch.setattr(rollout_role, "send", lambda world, message, rank, tag: sent.append(message))
    worker = RolloutWorker.__new__(RolloutWorker)  # no vLLM engine, no tokenizer: only the round runs
    worker.ctx = SimpleNamespace(world=None, orchestrator_rank=0)
    worker.engine = engine = _Engine()
    worker.episodes, worker.env_client = _Episodes(engine), None
    worker.crash = SimpleNamespace(fire=lambda: False)
    worker._waiting, worker._episodes_started, worker._generating_since = {}, False, None
    worker.loop = RoleLoop(worker.ctx, worker.handlers(), source=0)
    return worker, engine, sent


def test_new_episodes_submit_their_turn_before_the_engine_steps(monkeypatch):
    """Work that arrives is in the engine's very next step: in a sync run that step's batch is the whole share."""
    worker, engine, _ = _worker(monkeypatch)

    async def round_after_work() -> bool:
        worker.loop.handle(RolloutWork(["a", "b"], None, "train"), 0)
        return await worker._work()

    assert asyncio.run(round_after_work()) is True
    assert engine.steps == [2]


def test_samples_finished_in_a_round_go_out_at_the_start_of_the_next(monkeypatch):
    worker, engine, sent = _worker(monkeypatch)
    worker.episodes.finished = ["sample"]
    assert asyncio.run(worker._work()) is False  # a send alone is not movement: an idle engine naps
    assert sent == [RolloutDone(["sample"], [])] and engine.steps == []


def test_the_round_that_takes_shutdown_still_works_then_the_loop_ends(monkeypatch):
    worker, engine, sent = _worker(monkeypatch)
    worker.episodes.finished = ["last"]
    arrivals = [(Shutdown(), 0, 10)]
    monkeypatch.setattr("hetrl.control.role_loop.poll", lambda *args: arrivals.pop() if arrivals else None)
    asyncio.run(worker.run())
    assert sent == [RolloutDone(["last"], [])] and worker.loop.stop
