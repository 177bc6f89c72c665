"""The trainer's data plane: each data-parallel replica holds only its shard of a step, plus every sample's
metadata, and trains exactly as a replica holding the whole batch (TP=2: one replica) does."""

from __future__ import annotations

import pytest
import torch
from samples import make_samples

from hetrl.config.algorithm import AlgorithmConfig
from hetrl.config.critic import CriticConfig
from hetrl.config.model import ModelConfig
from hetrl.config.trainer import TrainerConfig
from hetrl.records import SampleMeta
from hetrl.trainer.shards import minibatch_bounds, shard_indices, step_shard

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
    samples = make_samples(NUM_SAMPLES, vocab=MODEL.vocab_size)
    for i, s in enumerate(samples):
        s.reward = float(i % 3) - 0.5
    return samples


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
                torch.testing.assert_close(got_lp, want_lp, atol=1e-5, rtol=1e-5, msg=f"{case} step {step}")
            torch.testing.assert_close(run["after"], base["after"], atol=1e-5, rtol=1e-5, msg=case)
        first = base["steps"][0][0]
        assert first["advantage/std"] > 0 and first["grad_norm"] > 0, case


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
