"""A rollout rank's round of the role loop, and what it does with the samples it holds: episodes and engine are
stand-ins, the order and the messages are the real ones."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from hetrl.control.comm import Tag
from hetrl.control.protocol import (
    DropSamples,
    RescoreSamples,
    RewardWork,
    RolloutDone,
    RolloutWork,
    ScoringView,
    ShipSamples,
    Shutdown,
    TrainShard,
)
from hetrl.control.role_loop import RoleLoop
from hetrl.loop import rollout_role
from hetrl.loop.rollout_role import RolloutWorker
from hetrl.records import CONVERSATION_KEY, EpisodeItem, Sample, SampleMeta

ORCHESTRATOR, REWARD = 0, 5


def _item(sample_id: str) -> EpisodeItem:
    return EpisodeItem(sample_id, sample_id.split(".")[0], None, 0)


def _sample(sample_id: str) -> Sample:
    n = 3
    return Sample(
        sample_id,
        sample_id.split(".")[0],
        "toy",
        [1, 2],
        [3, 4, 5],
        [1] * n,
        [-0.5] * n,
        [0] * n,
        completion_text="5",
        info={CONVERSATION_KEY: [{"role": "assistant", "content": "5"}], "env_wait_s": 0.1},
    )


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

    def start(self, item: EpisodeItem, sampling: object) -> None:
        self.held += 1
        asyncio.get_running_loop().create_task(self._turn(item.sample_id))

    async def _turn(self, item: str) -> None:
        self.engine.submitted.append(item)

    def take(self) -> tuple[list[Sample], list[str]]:
        finished, self.finished = self.finished, []
        return finished, []


def _worker(monkeypatch) -> tuple[RolloutWorker, _Engine, list]:
    sent: list = []
    monkeypatch.setattr(rollout_role, "send", lambda world, message, rank, tag: sent.append((message, rank, tag)))
    worker = RolloutWorker.__new__(RolloutWorker)  # no vLLM engine, no tokenizer: only the round runs
    worker.ctx = SimpleNamespace(world=None, orchestrator_rank=ORCHESTRATOR)
    worker.cfg = SimpleNamespace(reward=SimpleNamespace(reads_completion_ids=False))
    worker.held, worker._reward_rank = {}, {}
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
        worker.loop.handle(RolloutWork([_item("t0.0"), _item("t0.1")], None, "train", REWARD), ORCHESTRATOR)
        return await worker._work()

    assert asyncio.run(round_after_work()) is True
    assert engine.steps == [2]


def test_samples_finished_in_a_round_go_out_at_the_start_of_the_next(monkeypatch):
    """Their metadata to the orchestrator, their views to the reward rank their work named; the samples stay."""
    worker, engine, sent = _worker(monkeypatch)
    sample = _sample("t0.0")
    worker._reward_rank["t0.0"] = REWARD
    worker.episodes.finished = [sample]
    assert asyncio.run(worker._work()) is False  # a send alone is not movement: an idle engine naps
    assert sent == [
        (RolloutDone([SampleMeta.of(sample)], []), ORCHESTRATOR, Tag.RESULT),
        (RewardWork([ScoringView.of(sample, with_completion_ids=False)]), REWARD, Tag.WORK),
    ]
    assert engine.steps == [] and worker.held == {"t0.0": sample} and not worker._reward_rank
    meta = sent[0][0].metas[0]
    assert CONVERSATION_KEY not in meta.info and meta.completion_len == 3 and meta.num_policy_tokens == 3


def test_held_samples_are_shipped_to_trainer_replicas_sent_to_another_reward_rank_or_dropped(monkeypatch):
    worker, _, sent = _worker(monkeypatch)
    worker.held = {i: _sample(i) for i in ("t0.0", "t0.1", "t0.2")}
    worker.loop.handle(RescoreSamples(["t0.1"], 6), ORCHESTRATOR)
    assert sent.pop() == (RewardWork([ScoringView.of(worker.held["t0.1"], False)]), 6, Tag.WORK)
    kept = dict(worker.held)
    metas = {i: SampleMeta.of(sample) for i, sample in kept.items()}
    metas["t0.2"].reward, metas["t0.2"].flags = 1.0, ["hack/none"]  # the verdict goes with the sample
    metas["t0.2"].info["reward_metrics"] = {"math/correct": 1.0}
    worker.loop.handle(ShipSamples(4, [(7, [metas["t0.0"]]), (8, [metas["t0.2"], metas["t0.1"]])]), ORCHESTRATOR)
    assert sent == [
        (TrainShard(4, [kept["t0.0"]]), 7, Tag.SHARD),
        (TrainShard(4, [kept["t0.2"], kept["t0.1"]]), 8, Tag.SHARD),
    ]
    shipped = sent[1][0].samples[0]
    assert shipped.reward == 1.0 and shipped.flags == ["hack/none"] and shipped.logprobs == [-0.5] * 3
    assert shipped.info["reward_metrics"] == {"math/correct": 1.0} and CONVERSATION_KEY in shipped.info
    assert worker.held == {}
    worker.held = {"t1.0": _sample("t1.0")}
    worker.loop.handle(DropSamples(["t1.0"]), ORCHESTRATOR)
    assert worker.held == {}
    with pytest.raises(KeyError):  # a sample shipped or dropped is gone: at most once
        worker.loop.handle(ShipSamples(5, [(7, [SampleMeta.of(_sample("t1.0"))])]), ORCHESTRATOR)


def test_the_round_that_takes_shutdown_still_works_then_the_loop_ends(monkeypatch):
    worker, engine, sent = _worker(monkeypatch)
    last = _sample("t0.0")
    worker._reward_rank["t0.0"] = REWARD
    worker.episodes.finished = [last]
    arrivals = [(Shutdown(), 0, 10)]
    monkeypatch.setattr("hetrl.control.role_loop.poll", lambda *args: arrivals.pop() if arrivals else None)
    asyncio.run(worker.run())
    assert [m for m, _, _ in sent] == [
        RolloutDone([SampleMeta.of(last)], []),
        RewardWork([ScoringView.of(last, False)]),
    ]
    assert worker.loop.stop
