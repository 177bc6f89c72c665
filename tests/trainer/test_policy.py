"""PolicyTrainer: PP=2, TP=2 (with and without sequence parallelism) and CP=2 reproduce DP=2, EP=2 MoE trains with dense
params in sync, LR schedule."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from samples import make_samples

from hetrl.config.algorithm import AlgorithmConfig
from hetrl.config.model import ModelConfig
from hetrl.config.trainer import TrainerConfig

DENSE = ModelConfig(arch="llama", num_layers=2)
MOE = ModelConfig(arch="qwen3_moe", num_experts=4, moe_ffn_hidden_size=64, moe_router_topk=2, moe_aux_loss_coeff=1e-2)
ALGO = AlgorithmConfig(name="grpo", group_size=2, kl_coef=0.1, entropy_coef=0.01)


def _train(
    tcfg: TrainerConfig, mcfg: ModelConfig, num_steps: int, *, fixed_old: bool = False, samples: list | None = None
) -> dict:
    from hetrl.trainer.parallel import destroy_parallel
    from hetrl.trainer.policy import PolicyTrainer

    samples = samples or make_samples(8, vocab=mcfg.vocab_size)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.3, -0.3])
    trainer = PolicyTrainer(mcfg, tcfg, ALGO, seed=11, max_len=16)
    try:
        batch = trainer.make_batch(samples).with_advantages(advantages)
        old = trainer.compute_logprobs(batch) if fixed_old else None
        history = [trainer.train_step(batch, old_logprobs=old) for _ in range(num_steps)]
        dense, expert = {}, {}
        for name, p in trainer.module.named_parameters():
            (expert if "experts" in name else dense)[name] = float(p.detach().double().sum())
        return {"history": history, "dense": dense, "expert": expert, "final_logprobs": trainer.compute_logprobs(batch)}
    finally:
        destroy_parallel()


def _pp_tp_vs_baseline(rank: int, world_size: int) -> dict:
    base = TrainerConfig(precision="fp32", lr=1e-3, micro_batch_size=2, grad_clip=1.0)
    return {
        "dp2": _train(base, DENSE, 2),
        "pp2": _train(base.model_copy(update={"pipeline_parallel": 2}), DENSE, 2),
        "tp2": _train(base.model_copy(update={"tensor_parallel": 2}), DENSE, 2),
    }


def test_pp2_and_tp2_reproduce_the_data_parallel_run(two_ranks) -> None:
    results = two_ranks.run(_pp_tp_vs_baseline)
    base = results[0]["dp2"]
    for layout in ("pp2", "tp2"):
        for rank_result in results:
            run = rank_result[layout]
            for step, (got, want) in enumerate(zip(run["history"], base["history"])):
                for key in ("loss/total", "loss/policy", "loss/kl", "loss/entropy", "entropy", "grad_norm"):
                    assert abs(got[key] - want[key]) < 1e-5, f"{layout} step {step} {key}: {got[key]} vs {want[key]}"
            torch.testing.assert_close(run["final_logprobs"], base["final_logprobs"], atol=1e-5, rtol=0)
    first, second = base["history"]
    assert first["loss/kl"] == 0.0 and second["loss/kl"] > 0  # the reference stays, the policy moved
    assert second["grad_norm"] > 0 and first["perf/trainer_tokens_per_s"] > 0
    assert results[0]["dp2"]["dense"] == results[1]["dp2"]["dense"]  # DP replicas stay identical


def _cp_vs_baseline(rank: int, world_size: int) -> dict:
    base = TrainerConfig(precision="fp32", lr=1e-3, micro_batch_size=2, grad_clip=1.0)
    cp2 = {"context_parallel": 2}
    packed = base.model_copy(update={"pack_length": 32})
    # megatron's MoE aux loss is a per-micro-batch statistic, and DP=2 and CP=2 cut different
    # micro-batches: without it the two layouts must agree exactly.
    moe = MOE.model_copy(update={"moe_aux_loss_coeff": 0.0})
    moe_base = base.model_copy(update={"expert_parallel": 2})
    packed_dp2 = _train(packed, DENSE, 2)
    return {
        "dense": (_train(base, DENSE, 2), _train(base.model_copy(update=cp2), DENSE, 2)),
        "packed": (packed_dp2, _train(packed.model_copy(update=cp2), DENSE, 2)),
        "packed_pp2": (packed_dp2, _train(packed.model_copy(update={"pipeline_parallel": 2}), DENSE, 2)),
        "moe": (_train(moe_base, moe, 2), _train(moe_base.model_copy(update=cp2), moe, 2)),
    }


def test_cp2_reproduces_the_data_parallel_run(two_ranks) -> None:
    """CP=2 (each rank holds half of every sample) trains exactly as DP=2: dense, packed (THD) rows,
    MoE with EP=2; packed rows through a PP=2 pipeline too."""
    for rank_result in two_ranks.run(_cp_vs_baseline):
        for case, (base, cp) in rank_result.items():
            for step, (got, want) in enumerate(zip(cp["history"], base["history"])):
                for key in ("loss/total", "loss/policy", "loss/kl", "entropy", "grad_norm"):
                    assert abs(got[key] - want[key]) < 1e-5, f"{case} step {step} {key}: {got[key]} vs {want[key]}"
            torch.testing.assert_close(cp["final_logprobs"], base["final_logprobs"], atol=1e-5, rtol=0)
            assert cp["history"][1]["grad_norm"] > 0


def _norm_tags(rank: int, world_size: int) -> dict:
    from hetrl.trainer.model import build_gpt_model
    from hetrl.trainer.parallel import destroy_parallel, init_parallel

    tcfg = TrainerConfig(precision="fp32", tensor_parallel=2, sequence_parallel=True)
    groups = init_parallel(tcfg)
    try:
        model = build_gpt_model(MOE, tcfg, pg_collection=groups.pg_collection, seed=3)
        return {n: getattr(p, "sequence_parallel", None) for n, p in model.named_parameters() if "layernorm" in n}
    finally:
        destroy_parallel()


def test_local_norms_allow_sequence_parallelism_and_tag_their_weights(two_ranks) -> None:
    """megatron's local-spec norm (WrappedTorchNorm) asserts "sequence parallel not supported"; hetrl's builds, and
    tags the weights of norms on the sequence-parallel region, whose TP-partial gradients finalize_model_grads sums."""
    tags = two_ranks.run(_norm_tags)[0]
    sequence_region = {n: t for n, t in tags.items() if "q_layernorm" not in n and "k_layernorm" not in n}
    assert {n.split(".")[-2] for n in sequence_region} == {"input_layernorm", "pre_mlp_layernorm", "final_layernorm"}
    assert all(sequence_region.values()), sequence_region
    # qk-norm runs after the QKV projection gathered the sequence: not sequence parallel (reduced over TP by name)
    assert [t for n, t in tags.items() if n not in sequence_region] == [False] * 4  # 2 layers x q, k


def _tp2_sequence_parallel_vs_baseline(rank: int, world_size: int) -> dict:
    base = TrainerConfig(precision="fp32", lr=1e-3, micro_batch_size=2, grad_clip=1.0)
    sp = {"tensor_parallel": 2, "sequence_parallel": True}
    packed = base.model_copy(update={"pack_length": 32})
    # megatron's MoE aux loss is a per-micro-batch statistic and DP=2 cuts other micro-batches than DP=1 (TP=2): exact
    # agreement without it, or with it on a batch of one sample repeated (every micro-batch the same). That one is
    # compared over one step: its rounding-level gradient differences (~1e-7) reach the weights through Adam's first,
    # sign-like update of near-zero gradient entries, ~4e-5 in log-probs after a second step.
    moe = MOE.model_copy(update={"moe_aux_loss_coeff": 0.0})
    one = make_samples(8, vocab=MOE.vocab_size)[0]
    repeated = [dataclasses.replace(one, sample_id=f"s{i}", group_id=f"g{i // 2}") for i in range(8)]
    return {
        "dense": (_train(base, DENSE, 2), _train(base.model_copy(update=sp), DENSE, 2)),
        "packed": (_train(packed, DENSE, 2), _train(packed.model_copy(update=sp), DENSE, 2)),
        "moe": (_train(base, moe, 2), _train(base.model_copy(update=sp), moe, 2)),
        "moe_aux_loss": (
            _train(base, MOE, 1, samples=repeated),
            _train(base.model_copy(update=sp), MOE, 1, samples=repeated),
        ),
    }


def test_tp2_with_sequence_parallelism_reproduces_the_data_parallel_run(two_ranks) -> None:
    """TP=2 + SP on CPU (the layout MoE needs under TP) trains as DP=2: dense, packed rows, MoE, MoE with its aux
    loss. The norm weights, whose gradients each TP rank holds only for its share of the tokens, end where DP's do."""
    results = two_ranks.run(_tp2_sequence_parallel_vs_baseline)
    for rank_result in results:
        for case, (base, sp) in rank_result.items():
            for step, (got, want) in enumerate(zip(sp["history"], base["history"])):
                for key in ("loss/total", "loss/policy", "loss/kl", "entropy", "grad_norm"):
                    assert abs(got[key] - want[key]) <= 1e-5 * max(1.0, abs(want[key])), (
                        f"{case} step {step} {key}: {got[key]} vs {want[key]}"
                    )
            # The aux loss's one Adam step turns rounding-level gradient differences into whole sign-like updates of
            # near-zero entries: 2.0e-5 in log-probs on this AMD EPYC, under 1e-5 on the machines CI passed on before.
            atol = 1e-4 if case == "moe_aux_loss" else 1e-5
            torch.testing.assert_close(
                sp["final_logprobs"], base["final_logprobs"], atol=atol, rtol=0, msg=lambda m, case=case: f"{case}: {m}"
            )
            norms = [n for n in base["dense"] if "layernorm" in n]
            assert norms and all(abs(sp["dense"][n] - base["dense"][n]) < 1e-5 for n in norms), case
    for case in results[0]:  # replicated norm weights stay identical across the TP ranks
        assert {n: v for n, v in results[0][case][1]["dense"].items() if "layernorm" in n} == {
            n: v for n, v in results[1][case][1]["dense"].items() if "layernorm" in n
        }


def _moe_ep2(rank: int, world_size: int) -> dict:
    tcfg = TrainerConfig(precision="fp32", expert_parallel=2, lr=3e-3, micro_batch_size=2, grad_clip=10.0)
    return _train(tcfg, MOE, 6, fixed_old=True)


def test_ep2_moe_trains_and_keeps_dense_params_in_sync(two_ranks) -> None:
    results = two_ranks.run(_moe_ep2)
    losses = [m["loss/policy"] for m in results[0]["history"]]
    assert losses[-1] < losses[0] - 1e-3, losses
    assert results[0]["dense"] == results[1]["dense"]
    assert results[0]["expert"] != results[1]["expert"]  # each rank holds different experts
    assert len(results[0]["expert"]) == len(results[1]["expert"]) > 0
    assert [m["loss/policy"] for m in results[1]["history"]] == losses


def _schedule(rank: int, world_size: int) -> list[float]:
    from hetrl.trainer.parallel import destroy_parallel
    from hetrl.trainer.policy import PolicyTrainer

    tcfg = TrainerConfig(
        precision="fp32", lr=1e-3, min_lr=1e-4, lr_warmup_steps=2, lr_decay_style="linear", micro_batch_size=8
    )
    model = ModelConfig(
        arch="llama", num_layers=1, hidden_size=32, ffn_hidden_size=64, num_attention_heads=2, num_query_groups=1
    )
    trainer = PolicyTrainer(model, tcfg, AlgorithmConfig(group_size=2), total_steps=4)
    try:
        batch = trainer.make_batch(make_samples(4, vocab=model.vocab_size)).with_advantages(
            torch.tensor([1.0, -1.0, 1.0, -1.0])
        )
        return [trainer.train_step(batch)["lr"] for _ in range(4)]
    finally:
        destroy_parallel()


def test_lr_warms_up_then_decays(two_ranks) -> None:
    lrs = two_ranks.run(_schedule)[0]
    assert lrs == pytest.approx([5e-4, 1e-3, 5.5e-4, 1e-4])


def _reset(rank: int, world_size: int) -> dict:
    from hetrl.trainer.parallel import destroy_parallel
    from hetrl.trainer.policy import PolicyTrainer

    tcfg = TrainerConfig(precision="fp32", lr=1e-3, lr_warmup_steps=2, lr_decay_style="linear", micro_batch_size=8)
    model = ModelConfig(
        arch="llama", num_layers=1, hidden_size=32, ffn_hidden_size=64, num_attention_heads=2, num_query_groups=1
    )
    trainer = PolicyTrainer(model, tcfg, AlgorithmConfig(group_size=2), total_steps=4)
    try:
        batch = trainer.make_batch(make_samples(4, vocab=model.vocab_size)).with_advantages(
            torch.tensor([1.0, -1.0, 1.0, -1.0])
        )
        before = [trainer.train_step(batch)["lr"] for _ in range(3)]
        trainer.reset_optimizer(total_steps=4)
        states = [
            s
            for group in trainer.optimizer.get_parameters()
            for s in [trainer.optimizer.optimizer.state.get(group)]
            if s
        ]
        after = [trainer.train_step(batch)["lr"] for _ in range(2)]
        return {"before": before, "after": after, "fresh_state": len(states)}
    finally:
        destroy_parallel()


def test_reset_optimizer_starts_a_new_stage(two_ranks) -> None:
    result = two_ranks.run(_reset)[0]
    assert result["before"] == pytest.approx([5e-4, 1e-3, 5e-4])
    assert result["fresh_state"] == 0  # no Adam moments carried over
    assert result["after"] == pytest.approx([5e-4, 1e-3])  # the warmup runs again


def _threads_after_layouts(rank: int, world_size: int) -> list[int]:
    """This rank's thread count after each of four CP=2, EP=2 trainers is built and torn down."""
    import gc
    import os

    from hetrl.trainer.parallel import destroy_parallel
    from hetrl.trainer.policy import PolicyTrainer

    tcfg = TrainerConfig(precision="fp32", context_parallel=2, expert_parallel=2, micro_batch_size=2)
    counts = []
    for _ in range(4):
        trainer = PolicyTrainer(MOE, tcfg, ALGO, max_len=16)
        destroy_parallel()
        del trainer
        gc.collect()
        counts.append(len(os.listdir("/proc/self/task")))
    return counts


def test_destroy_parallel_frees_megatron_groups(two_ranks) -> None:
    """Each gloo group megatron builds owns threads and sockets; a torn-down layout must free them
    (they piled up to thousands of threads over the test session and stalled gloo)."""
    for counts in two_ranks.run(_threads_after_layouts):
        assert counts[-1] - counts[1] <= 2, counts


def _old_from_the_update_vs_a_separate_pass(rank: int, world_size: int) -> dict:
    """The same first update twice: old log-probs from a forward of their own, then from the update's."""
    from hetrl.trainer.parallel import destroy_parallel
    from hetrl.trainer.policy import PolicyTrainer

    out = {}
    for layout, update in (("dp2", {}), ("pp2", {"pipeline_parallel": 2})):
        tcfg = TrainerConfig(precision="fp32", lr=1e-3, micro_batch_size=2, grad_clip=1.0, **update)
        runs = []
        for separate in (True, False):
            trainer = PolicyTrainer(DENSE, tcfg, ALGO, seed=11, max_len=16)
            try:
                batch = trainer.make_batch(make_samples(8, vocab=DENSE.vocab_size)).with_advantages(
                    torch.linspace(-1, 1, 8)
                )
                if separate:
                    old = trainer.compute_logprobs(batch)
                    metrics = trainer.train_step(batch, old_logprobs=old)
                else:
                    metrics, old = trainer.train_step(batch, with_logprobs=True)
                after = trainer.compute_logprobs(batch)
                runs.append({"metrics": metrics, "old": old, "rows": batch.global_indices, "after": after})
            finally:
                destroy_parallel()
        out[layout] = runs
    return out


def test_old_logprobs_from_the_update_forward_equal_a_separate_pass(two_ranks) -> None:
    for rank_result in two_ranks.run(_old_from_the_update_vs_a_separate_pass):
        for layout, (separate, from_update) in rank_result.items():
            # The update's are this replica's rows only (batch order), a separate pass's the whole batch's.
            rows, width = from_update["rows"], from_update["old"].shape[1]
            torch.testing.assert_close(from_update["old"], separate["old"][rows, :width], atol=1e-6, rtol=0, msg=layout)
            assert not separate["old"][rows, width:].any(), layout
            torch.testing.assert_close(from_update["after"], separate["after"], atol=1e-6, rtol=0, msg=layout)
            for key in ("loss/total", "loss/policy", "grad_norm"):
                assert abs(from_update["metrics"][key] - separate["metrics"][key]) < 1e-6, (layout, key)
