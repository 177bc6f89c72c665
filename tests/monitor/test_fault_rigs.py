"""The injected faults the guard rigs use (hetrl.loop.faults), and the trainer's phase clock."""

from __future__ import annotations

import math

import pytest

from hetrl.control.protocol import TrainWork
from hetrl.loop import faults
from hetrl.loop.faults import Fault, Onset, RankFaults
from hetrl.loop.reward_role import _RiggedFaults as RewardFaults
from hetrl.loop.trainer_role import _Clock
from hetrl.loop.trainer_role import _RiggedFaults as TrainerFaults
from hetrl.records import Sample, SampleMeta


def _sample(i: int, reward: float = 0.25) -> Sample:
    return Sample(f"t0.{i}", "t0", "toy", [1], [2, 3], [1, 1], [0.0, 0.0], [0, 0], reward=reward)


def test_parse_new_kinds_and_reject_unknown():
    parsed = Fault.parse("reward:0:reward_drop@5,trainer:1:nan_loss")
    assert [(f.role, f.role_rank, f.kind, f.at) for f in parsed] == [
        ("reward", 0, "reward_drop", 5),
        ("trainer", 1, "nan_loss", 1),
    ]
    with pytest.raises(ValueError, match="kind must be one of"):
        Fault.parse("trainer:0:nan_gradients")


def test_a_rank_gets_only_its_own_faults_and_env_crash_is_a_kind():
    rank = RankFaults(Fault.parse("env:1:env_crash@2,env:0:env_crash@3,reward:1:scorer_crash"), "env", 1)
    crash = rank.countdown("env_crash")
    assert [crash.fire() for _ in range(3)] == [False, True, False]
    assert not rank.countdown("scorer_crash").fire()  # another role's fault


def test_onset_stays_on_from_the_nth_call():
    onset = Onset(Fault.parse("reward:0:reward_drop@3"), "reward", 0, "reward_drop")
    assert [onset.fire() for _ in range(5)] == [False, False, True, True, True]
    assert not Onset(Fault.parse("reward:1:reward_drop@1"), "reward", 0, "reward_drop").fire()  # another rank's fault


def test_reward_drop_lowers_every_reward_from_the_nth_sample(monkeypatch):
    monkeypatch.setenv(faults.FAULT_ENV, "reward:0:reward_drop@2")
    rigged = RewardFaults(RankFaults.from_env("reward", 0))
    assert [rigged.after_scoring(_sample(i)).reward for i in range(3)] == [
        0.25,
        0.25 - faults.REWARD_DROP,
        0.25 - faults.REWARD_DROP,
    ]


def test_nan_loss_poisons_only_the_nth_batch(monkeypatch):
    monkeypatch.setenv(faults.FAULT_ENV, "trainer:0:nan_loss@2")
    rigged = TrainerFaults(RankFaults.from_env("trainer", 0))
    work = TrainWork.of(0, [SampleMeta.of(_sample(0))])
    assert [m.reward for m in rigged.metas(work)] == [0.25]
    poisoned = rigged.metas(work)
    assert all(math.isnan(m.reward) for m in poisoned) and work.metas[0].reward == 0.25
    assert [m.reward for m in rigged.metas(work)] == [0.25]


def test_clock_reports_each_timed_phase_once():
    clock = _Clock()
    with clock.timing("wait"):
        pass
    with clock.timing("wait"):
        pass
    taken = clock.take()
    assert set(taken) == {"time/wait"} and taken["time/wait"] >= 0
    assert clock.take() == {}  # a phase not timed since is absent, not 0
