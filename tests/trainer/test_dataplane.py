"""The trainer's data plane: each data-parallel replica holds only its shard of a step, plus every sample's
metadata, and trains exactly as a replica holding the whole batch (TP=2: one replica) does; through the trainer
role, each replica's receiver takes only its own shard from the holders, and stores it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from samples import make_step

from hetrl.config.algorithm import AlgorithmConfig
from hetrl.config.critic import CriticConfig
from hetrl.config.model import ModelConfig
from hetrl.config.trainer import TrainerConfig
from hetrl.launch.local import find_mpiexec
from hetrl.monitor.mismatch import mismatch_metrics
from hetrl.monitor.rollout_store import RolloutReader
from hetrl.records import SampleMeta
from hetrl.trainer.shards import minibatch_bounds, shard_indices, step_shard

RIG = Path(__file__).with_name("replica_rig.py")

MODEL = ModelConfig(arch="llama", num_layers=2)
BASE = TrainerConfig(precision="fp32", lr=1e-3, micro_batch_size=2, grad_clip=1.0)
CASES = {
    # KL folded into the reward (per-sample KL sums over the step) and DAPO's overlong term.
    "grpo_kl_in_reward": (
        AlgorithmConfig(name="grpo", group_size=2, kl_coef=0.1, kl_in_reward=True, overlong_buffer=4),
        {},
    ),
    # A critic and batch-whitened GAE advantages.
    "ppo": (AlgorithmConfig(name="ppo", group_size=2), {}),
    # A group's samples share one model row, so they travel to one replica together.
    "grpo_shared_prompts": (AlgorithmConfig(name="grpo", group_size=2, kl_coef=0.1), {"shared_prompts": True}),
}
NUM_SAMPLES, NUM_MINIBATCHES = 12, 2


def _step() -> list:
    return make_step(NUM_SAMPLES, vocab=MODEL.vocab_size)


def _train(case: str, layout: dict) -> dict:
    from hetrl.trainer.critic import ValueTrainer
    from hetrl.trainer.parallel import destroy_parallel
    from hetrl.trainer.policy import PolicyTrainer
    from hetrl.trainer.rl_step import replica_shard, train_on_batch

    algo, update = CASES[case]
    tcfg = BASE.model_copy(update={**update, **layout})
    samples = _step()
    policy = PolicyTrainer(MODEL, tcfg, algo, seed=5, max_len=16)
    critic = (
        ValueTrainer(MODEL, tcfg, CriticConfig(lr=1e-2), algo, policy.groups, seed=5, max_len=16)
        if algo.name == "ppo"
        else None
    )
    try:
        metas = [SampleMeta.of(s) for s in samples]
        shard = {i: samples[i] for i in replica_shard(policy, metas, NUM_MINIBATCHES)}
        steps = [
            train_on_batch(policy, critic, metas, shard, num_minibatches=NUM_MINIBATCHES, max_tokens=16)
            for _ in range(2)
        ]
        # The updated weights, as the whole batch's log-probs under them.
        after = policy.compute_logprobs(policy.make_batch(samples))
        return {"shard": sorted(shard), "steps": steps, "after": after}
    finally:
        destroy_parallel()


def _layouts(rank: int, world_size: int) -> dict:
    return {case: {"dp2": _train(case, {}), "tp2": _train(case, {"tensor_parallel": 2})} for case in CASES}


def test_a_replica_trained_on_its_shard_matches_one_holding_the_whole_batch(two_ranks) -> None:
    results = two_ranks.run(_layouts)
    for case in CASES:
        shards = [results[rank][case]["dp2"]["shard"] for rank in range(2)]
        assert sorted(shards[0] + shards[1]) == list(range(NUM_SAMPLES)), case  # each sample on one replica
        assert all(len(shard) == NUM_SAMPLES // 2 for shard in shards), case
        assert results[0][case]["tp2"]["shard"] == list(range(NUM_SAMPLES)), case
        base = results[0][case]["tp2"]
        for rank in range(2):
            run = results[rank][case]["dp2"]
            for step, ((got, got_lp), (want, want_lp)) in enumerate(zip(run["steps"], base["steps"])):
                assert got.keys() == want.keys()
                for key in want:
                    if "per_s" in key or key.endswith("_s") or key.endswith("clip_frac"):
                        continue  # timings; a token on the clip boundary may tip either way
                    # TP sums a grad norm's parts in another order: 1.6e-5 relative seen on a critic's (~13).
                    tolerance = (5e-5 if "grad_norm" in key else 1e-5) * max(1.0, abs(want[key]))
                    assert abs(got[key] - want[key]) < tolerance, f"{case} rank {rank} step {step} {key}"
                assert sorted(got_lp) == shards[rank], case  # the log-probs of the replica's own samples
                for i, row in got_lp.items():
                    torch.testing.assert_close(row, want_lp[i], atol=1e-5, rtol=1e-5, msg=f"{case} step {step} {i}")
            torch.testing.assert_close(run["after"], base["after"], atol=1e-5, rtol=1e-5, msg=case)
        first = base["steps"][0][0]
        assert first["advantage/std"] > 0 and first["grad_norm"] > 0, case
        _assert_mismatch_of_the_whole_step([results[rank][case]["dp2"]["steps"] for rank in range(2)], case)


def _assert_mismatch_of_the_whole_step(steps_by_rank: list, case: str) -> None:
    """Each rank's mismatch (its replica's totals reduced over DP) is mismatch_metrics over the whole batch."""
    samples = _step()
    for step, per_rank in enumerate(zip(*steps_by_rank)):
        logprobs = {i: row for _, rows in per_rank for i, row in rows.items()}
        want = mismatch_metrics(
            [s.logprobs for s in samples],
            [logprobs[i].tolist() for i in range(NUM_SAMPLES)],
            [s.loss_mask for s in samples],
        )
        assert want, case
        for metrics, _ in per_rank:
            for key, value in want.items():
                assert abs(metrics[key] - value) < 1e-6 * max(1.0, abs(value)), f"{case} step {step} {key}"


def _missing_sample(rank: int, world_size: int) -> str:
    from hetrl.trainer.parallel import destroy_parallel
    from hetrl.trainer.policy import PolicyTrainer
    from hetrl.trainer.rl_step import replica_shard, train_on_batch

    samples = _step()
    policy = PolicyTrainer(MODEL, BASE, AlgorithmConfig(name="grpo", group_size=2), seed=5, max_len=16)
    try:
        metas = [SampleMeta.of(s) for s in samples]
        shard = {i: samples[i] for i in replica_shard(policy, metas, 1)[1:]}
        with pytest.raises(ValueError, match=f"data-parallel rank {rank} lacks samples") as error:
            train_on_batch(policy, None, metas, shard, num_minibatches=1, max_tokens=16)
        return str(error.value)
    finally:
        destroy_parallel()


def test_a_replica_missing_a_sample_of_its_shard_says_which(two_ranks) -> None:
    two_ranks.run(_missing_sample)


def test_the_step_shards_partition_each_minibatch() -> None:
    """What the orchestrator computes from metadata: every sample on one replica, inside its own minibatch."""
    metas = [SampleMeta.of(s) for s in _step()]
    for shared in (False, True):
        shards = [step_shard(metas, NUM_MINIBATCHES, rank, 2, shared_prompts=shared) for rank in range(2)]
        assert sorted(shards[0] + shards[1]) == list(range(NUM_SAMPLES))
        for a, b in minibatch_bounds(NUM_SAMPLES, NUM_MINIBATCHES):
            for rank, shard in enumerate(shards):
                assert [i - a for i in shard if a <= i < b] == shard_indices(metas[a:b], rank, 2, shared_prompts=shared)


@pytest.mark.mpi
def test_each_replica_receives_only_its_shard_and_stores_it(tmp_path) -> None:
    """Through the trainer role (rig: replica_rig.py): the leader announces both replicas' receivers, each receiver
    takes its own samples (two TrainShard parts each, nothing else), the RL step's TrainDone carries the mismatch of
    the whole step, and the receivers' store parts hold every RL sample once, scored, with its trainer log-probs
    (the warm-start step's demonstrations are not stored)."""
    proc = subprocess.run(
        [find_mpiexec(), "-launcher", "fork", "-n", "3", sys.executable, str(RIG), str(tmp_path)],
        cwd=RIG.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["layout"] == {"receivers": [1, 2], "tokens_per_image": None, "shared_prompts": True}
    warm, rl = result["done"]
    assert not any(key.startswith("mismatch/") for key in warm)
    samples = make_step(NUM_SAMPLES, vocab=128, seed=1)  # the rig's RL step (tiny_llama's vocabulary)
    metas = [SampleMeta.of(s) for s in samples]
    reader = RolloutReader(tmp_path)
    assert [path.name for path in reader.files()] == ["rollouts-dp0-0000.h5", "rollouts-dp1-0000.h5"]
    records = reader.records()
    for dp_rank, path in enumerate(reader.files()):
        stored = [r.sample.sample_id for r in records if r.file == str(path)]
        assert stored == [metas[i].sample_id for i in step_shard(metas, 1, dp_rank, 2, shared_prompts=True)]
    by_id = {r.sample.sample_id: r for r in records}
    assert len(records) == len(by_id) == NUM_SAMPLES and {r.step for r in records} == {0}
    for s in samples:
        record = by_id[s.sample_id]
        assert record.sample.reward == s.reward and len(record.trainer_logprobs) == len(s.completion_ids)
    want = mismatch_metrics(
        [s.logprobs for s in samples],
        [by_id[s.sample_id].trainer_logprobs for s in samples],
        [s.loss_mask for s in samples],
    )
    assert want.keys() <= rl.keys()
    for key, value in want.items():
        assert abs(rl[key] - value) < 1e-6 * max(1.0, abs(value)), key
