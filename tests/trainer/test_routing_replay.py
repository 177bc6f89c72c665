"""Rollout routing replay (R3): the engine's MoE routing reaches every router at the right token, and is obeyed.

* Layout (no ranks): ``Sample.routed_experts`` rows land at their tokens in every micro-batch layout
  (rows, packed THD, uniform/length-multiple/filler padding, CP shards, SP shares), -1 elsewhere.
* One rank: routing equal to the model's own gives zero disagreement and, replayed, exactly the
  log-probs of no replay; other routing is counted as disagreement and, replayed, changes the
  log-probs; the router still learns through the replayed experts' gate scores.
* Two ranks: the same under PP=2 (each stage's routers take their own layers), TP=2, CP=2 and EP=2.

The model's own routing is recorded by putting a recorder where megatron asks for its top-k
(``TopKRouter.router_replay``) and feeding each sample alone: independent of the trainer's layout code.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from rank_pool import RankPool
from samples import make_samples, whole_step

from hetrl.config.algorithm import AlgorithmConfig
from hetrl.config.model import ModelConfig
from hetrl.config.trainer import TrainerConfig
from hetrl.records import Sample
from hetrl.trainer.batch import build_train_batch
from hetrl.trainer.context_parallel import local_positions, shard_micro_batch

LAYERS, TOP_K, EXPERTS = 2, 2, 4
# moe_aux_loss_coeff=0: the router's only gradient is the one through the (replayed) experts' gate scores.
MOE = ModelConfig(
    arch="qwen3_moe",
    num_experts=EXPERTS,
    moe_router_topk=TOP_K,
    moe_ffn_hidden_size=64,
    moe_aux_loss_coeff=0.0,
    hidden_size=64,
    ffn_hidden_size=128,
    num_layers=LAYERS,
    vocab_size=128,
)
ALGO = AlgorithmConfig(name="grpo", group_size=2)
SEED = 5


# ---------------------------------------------------------------------------------------------
# Layout: routing as a function of (token, position in its sample), so every row can be checked
# against the tokens it sits next to.


def code(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``[..., layers, top_k]`` routing codes (< 256) of tokens at their in-sample positions."""
    layer = torch.arange(LAYERS)[:, None]
    slot = torch.arange(TOP_K)[None, :]
    return (tokens[..., None, None] + 3 * positions[..., None, None] + 5 * layer + 7 * slot) % 256


def with_code_routing(samples: list[Sample]) -> list[Sample]:
    out = []
    for s in samples:
        ids = torch.tensor(s.prompt_ids + s.completion_ids)
        rows = code(ids, torch.arange(len(ids)))[:-1]  # the last token was never fed to the engine
        out.append(replace(s, routed_experts=rows.numpy().astype(np.uint8)))
    return out


def expected_routing(mb, samples: list[Sample]) -> torch.Tensor:
    """The micro-batch's routing rebuilt from its layout: each sample's rows at its span, -1 elsewhere."""
    want = torch.full((*mb.tokens.shape, LAYERS, TOP_K), -1, dtype=torch.long)
    for i, k in enumerate(mb.sample_indices):
        s = samples[k]
        ids = s.prompt_ids + s.completion_ids
        row, start = (
            (i, 0) if mb.cu_seqlens is None else (0, int(mb.cu_seqlens_padded[i]))
        )  # one row each, or packed spans
        assert mb.tokens[row, start : start + len(ids)].tolist() == ids
        if s.routed_experts is not None:
            want[row, start : start + len(ids) - 1] = torch.from_numpy(s.routed_experts.astype(np.int64))
    return want


def check_follows_tokens(mb) -> int:
    """Every routed row carries its own token's code; returns the number of routed positions."""
    routed = mb.routed_experts
    assert routed is not None and routed.dtype == torch.long and routed.shape == (*mb.tokens.shape, LAYERS, TOP_K)
    valid = routed[..., 0, 0] >= 0
    assert ((routed >= 0) == valid[..., None, None]).all()  # a position is routed in every layer and slot, or in none
    assert torch.equal(routed[valid], code(mb.tokens, mb.position_ids)[valid])
    return int(valid.sum())


def routed_positions(samples: list[Sample]) -> int:
    return sum(len(s.prompt_ids) + len(s.completion_ids) - 1 for s in samples)


@pytest.mark.parametrize("pack_length", [None, 24])
def test_routing_lands_at_each_samples_tokens_and_survives_padding(pack_length: int | None) -> None:
    samples = with_code_routing(make_samples(7))
    batch = build_train_batch(samples, micro_batch_size=3, pack_length=pack_length)
    assert len(batch.micro_batches) > 1
    for mb in batch.micro_batches:
        assert torch.equal(mb.routed_experts, expected_routing(mb, samples))  # -1 at padding and each last token
    assert sum(check_follows_tokens(mb) for mb in batch.micro_batches) == routed_positions(samples)

    uniform = batch.with_length_multiple(4).uniform()
    assert len({mb.tokens.shape for mb in uniform.micro_batches}) == 1
    for padded in (batch.uniform(), batch.with_length_multiple(4), uniform):
        for mb in padded.micro_batches:
            assert torch.equal(mb.routed_experts, expected_routing(mb, samples))
        assert sum(check_follows_tokens(mb) for mb in padded.micro_batches) == routed_positions(samples)
    if pack_length:  # each packed sample got its own padding, inside the row
        spans = [length for mb in batch.with_length_multiple(4).micro_batches for _, length in mb.spans]
        assert all(length % 4 == 0 for length in spans)

    filled = batch.padded_to(len(batch.micro_batches) + 2)
    for filler in filled.micro_batches[-2:]:
        assert filler.num_samples == 0 and filler.routed_experts.shape == (*filler.tokens.shape, LAYERS, TOP_K)
        assert (filler.routed_experts == -1).all()
    uniform = filled.uniform()
    assert all(mb.routed_experts.shape[:2] == mb.tokens.shape for mb in uniform.micro_batches)


@pytest.mark.parametrize("pack_length", [None, 24])
def test_context_parallel_shards_keep_routing_with_their_tokens(pack_length: int | None) -> None:
    samples = with_code_routing(make_samples(6))
    batch = build_train_batch(samples, micro_batch_size=3, pack_length=pack_length).with_length_multiple(4)
    for mb in batch.micro_batches:
        shards = [shard_micro_batch(mb, 2, rank) for rank in range(2)]
        for rank, local in enumerate(shards):
            assert torch.equal(local.routed_experts, mb.routed_experts[:, local_positions(mb.spans, 2, rank)])
        assert sum(check_follows_tokens(local) for local in shards) == check_follows_tokens(mb)


def test_routing_is_all_or_nothing_and_of_one_shape() -> None:
    samples = with_code_routing(make_samples(4))
    plain = make_samples(4)
    assert all(mb.routed_experts is None for mb in build_train_batch(plain, micro_batch_size=4).micro_batches)
    with pytest.raises(ValueError, match="policy tokens but no engine routing"):
        build_train_batch([samples[0], plain[1], samples[2]], micro_batch_size=4)
    with pytest.raises(ValueError, match="policy tokens but no engine routing"):
        build_train_batch([samples[0], plain[1]], micro_batch_size=4, pack_length=32)
    wider = replace(
        plain[1],
        routed_experts=np.zeros((len(plain[1].prompt_ids) + len(plain[1].completion_ids) - 1, LAYERS, 3), np.uint8),
    )
    with pytest.raises(ValueError, match="different shapes"):
        build_train_batch([samples[0], wider], micro_batch_size=4)
    # A sample with nothing to learn from (a demonstration turn, an empty completion) may come without routing.
    quiet = replace(plain[1], loss_mask=[0] * len(plain[1].loss_mask), logprobs=[0.0] * len(plain[1].logprobs))
    mb = build_train_batch([samples[0], quiet], micro_batch_size=4).micro_batches[0]
    assert torch.equal(mb.routed_experts, expected_routing(mb, [samples[0], quiet]))
    assert (mb.routed_experts[mb.sample_indices.index(1)] == -1).all()


def test_sample_rejects_routing_of_the_wrong_length() -> None:
    s = make_samples(1)[0]
    rows = len(s.prompt_ids) + len(s.completion_ids) - 1
    replace(s, routed_experts=np.zeros((rows, LAYERS, TOP_K), np.uint8))  # the right shape is accepted
    for bad in ((rows + 1, LAYERS, TOP_K), (rows - 1, LAYERS, TOP_K), (rows, LAYERS)):
        with pytest.raises(ValueError, match="routed_experts must be"):
            replace(s, routed_experts=np.zeros(bad, np.uint8))


def test_sequence_parallel_ranks_take_their_contiguous_share_in_router_order() -> None:
    """Under SP each TP rank routes its share of megatron's sequence-major ``[s, b]`` tokens (SP does
    not build on CPU, megatron's local norm refuses it, so ``load`` is checked on its own here)."""
    from hetrl.trainer.routing_replay import RoutingReplay

    samples = with_code_routing(make_samples(3))
    mb = build_train_batch(samples, micro_batch_size=3).with_length_multiple(2).micro_batches[0]

    def loaded(tp_size: int, tp_rank: int, sequence_parallel: bool) -> RoutingReplay:
        replay = RoutingReplay.__new__(RoutingReplay)  # the routers are megatron's; only the layout is under test
        replay.groups = SimpleNamespace(tp_size=tp_size, tp_rank=tp_rank)
        replay.num_layers, replay.sequence_parallel, replay.replay = LAYERS, sequence_parallel, True
        replay.load(mb)
        return replay

    whole = loaded(1, 0, False)
    seq_major = mb.routed_experts.transpose(0, 1).reshape(-1, LAYERS, TOP_K)
    assert torch.equal(whole.valid, seq_major[:, 0, 0] >= 0)
    assert torch.equal(whole.targets[whole.valid], seq_major[whole.valid])
    assert (whole.targets[~whole.valid] == torch.arange(TOP_K)).all()  # unrouted tokens take experts 0..k-1
    assert torch.equal(loaded(2, 1, False).targets, whole.targets)  # without SP every TP rank routes every token
    shares = [loaded(2, rank, True) for rank in range(2)]
    assert torch.equal(torch.cat([s.targets for s in shares]), whole.targets)
    assert torch.equal(torch.cat([s.valid for s in shares]), whole.valid)
    s_half = mb.tokens.shape[1] // 2
    second = code(mb.tokens[:, s_half:], mb.position_ids[:, s_half:]).transpose(0, 1).reshape(-1, LAYERS, TOP_K)
    assert torch.equal(shares[1].targets[shares[1].valid], second[shares[1].valid])
    with pytest.raises(ValueError, match="routing for 2 MoE layers, the model has 3"):
        replay = RoutingReplay.__new__(RoutingReplay)
        replay.groups, replay.num_layers, replay.sequence_parallel = SimpleNamespace(tp_size=1, tp_rank=0), 3, False
        replay.load(mb)


# ---------------------------------------------------------------------------------------------
# The trainer obeys it.


class _Recorder:
    """Stands where megatron asks a router for its top-k: computes it, and keeps it."""

    def get_replay_topk(self, scores, topk, num_groups=None, group_topk=None, default_compute_topk=None):  # noqa: ANN001, ANN201
        values, indices = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        self.indices = indices.clone()
        return values, indices


def own_routing(model: torch.nn.Module, samples: list[Sample]) -> list[np.ndarray]:
    """Each sample fed alone to a whole (TP=PP=1) model: the experts its routers choose, [L - 1, layers, k]."""
    from megatron.core.transformer.moe.router import TopKRouter

    routers = sorted((m for m in model.modules() if isinstance(m, TopKRouter)), key=lambda r: r.layer_number)
    assert len(routers) == LAYERS
    kept, was_training = [r.router_replay for r in routers], model.training
    out = []
    model.eval()
    try:
        with torch.no_grad():
            for s in samples:
                recorders = [_Recorder() for _ in routers]
                for router, recorder in zip(routers, recorders):
                    router.router_replay = recorder
                ids = torch.tensor([s.prompt_ids + s.completion_ids])
                model(ids, torch.arange(ids.shape[1])[None], None)
                out.append(torch.stack([r.indices for r in recorders], dim=1)[:-1].numpy().astype(np.uint8))
    finally:
        for router, replay in zip(routers, kept):
            router.router_replay = replay
        model.train(was_training)
    return out


def own_routing_of_a_fresh_model(samples: list[Sample]) -> list[np.ndarray]:
    """:func:`own_routing` of the model every layout builds from ``SEED`` (built whole on this rank)."""
    from hetrl.trainer.model import build_gpt_model
    from hetrl.trainer.parallel import destroy_parallel, init_parallel

    tcfg = TrainerConfig(precision="fp32")
    groups = init_parallel(tcfg)
    try:
        return own_routing(build_gpt_model(MOE, tcfg, pg_collection=groups.pg_collection, seed=SEED), samples)
    finally:
        destroy_parallel()


def shifted(routing: list[np.ndarray]) -> list[np.ndarray]:
    """Every expert e -> e + 1 (mod E): for top-2 of 4 never the same set, so every pair disagrees."""
    return [((r.astype(np.int64) + 1) % EXPERTS).astype(np.uint8) for r in routing]


def carrying(samples: list[Sample], routing: list[np.ndarray]) -> list[Sample]:
    return [replace(s, routed_experts=r) for s, r in zip(samples, routing)]


def router_weights(trainer) -> torch.Tensor:  # noqa: ANN001 - a PolicyTrainer
    return torch.cat(
        [p.detach().flatten().clone() for n, p in trainer.module.named_parameters() if n.endswith("router.weight")]
    )


@pytest.fixture(scope="module")
def one_rank():
    """A world of one gloo rank (the session's two-rank pool would make every trainer DP=2)."""
    pool = RankPool(1)
    yield pool
    pool.close()


def _single_rank(rank: int, world_size: int) -> dict:
    from hetrl.monitor import names
    from hetrl.trainer.parallel import destroy_parallel
    from hetrl.trainer.policy import PolicyTrainer
    from hetrl.trainer.rl_step import train_on_batch

    samples = make_samples(6, vocab=MOE.vocab_size)
    tcfg = TrainerConfig(precision="fp32", micro_batch_size=3, lr=1e-2, grad_clip=0.0)
    out: dict = {}
    measure = PolicyTrainer(MOE, tcfg, ALGO, seed=SEED, routing="measure")
    replay = PolicyTrainer(MOE, tcfg, ALGO, seed=SEED, routing="replay")
    try:
        own = own_routing(measure.module, samples)
        out["own_matches_fresh"] = all(np.array_equal(a, b) for a, b in zip(own, own_routing(replay.module, samples)))
        batches = {  # rows, packed THD rows, and the trainer's own (filler-padded) batch
            "rows": lambda s: build_train_batch(s, micro_batch_size=2),
            "packed": lambda s: build_train_batch(s, micro_batch_size=2, pack_length=32),
        }
        for layout, make in batches.items():
            for name, trainer in (("measure", measure), ("replay", replay)):
                out[layout, name, "none"] = trainer.compute_logprobs(make(samples))
                out[layout, name, "none", "disagree"] = trainer.routing.take_disagreement()
                for routing_name, routing in (("own", own), ("shifted", shifted(own))):
                    out[layout, name, routing_name] = trainer.compute_logprobs(make(carrying(samples, routing)))
                    out[layout, name, routing_name, "disagree"] = trainer.routing.take_disagreement()
        try:
            replay.compute_logprobs(
                build_train_batch(
                    carrying(samples, [np.concatenate([r, r[:, :1]], axis=1) for r in own]), micro_batch_size=2
                )
            )
        except ValueError as e:
            out["wrong_layers"] = str(e)

        # Training: replaying the model's own routing is training without replay; replaying other
        # routing still trains the router (through the replayed experts' gate scores, no aux loss here).
        advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
        for name, trainer, routing in (("measure_own", measure, own), ("replay_own", replay, own)):
            batch = trainer.make_batch(carrying(samples, routing)).with_advantages(advantages)
            metrics = trainer.train_step(batch)  # old log-probs from this forward: it is measured
            out[name, "metrics"] = metrics
            out[name, "disagree"] = trainer.routing.take_disagreement()
        before = router_weights(replay)
        now = own_routing(replay.module, samples)  # the step above moved the router
        batch = replay.make_batch(carrying(samples, shifted(now))).with_advantages(advantages)
        metrics = replay.train_step(batch)
        out["replay_shifted", "router_moved"] = float((router_weights(replay) - before).abs().max())
        out["replay_shifted", "metrics"] = metrics
        out["replay_shifted", "disagree"] = replay.routing.take_disagreement()

        for s, r in zip(samples, shifted(own_routing(measure.module, samples))):
            s.routed_experts, s.reward = r, float(len(s.completion_ids) % 3)
        metrics, _ = train_on_batch(measure, None, *whole_step(samples), num_minibatches=1, max_tokens=16)
        out["rl_step_disagree"] = metrics.get(names.ROUTING_DISAGREE_FRAC)
        return out
    finally:
        destroy_parallel()


@pytest.fixture(scope="module")
def single(one_rank) -> dict:
    return one_rank.run(_single_rank)[0]


def test_measuring_counts_disagreement_and_changes_nothing(single: dict) -> None:
    assert single["own_matches_fresh"]  # both trainers are the same model
    for layout in ("rows", "packed"):
        base = single[layout, "measure", "none"]
        assert (base != 0).sum() > 30
        assert single[layout, "measure", "none", "disagree"] is None  # no routing, nothing measured
        assert single[layout, "measure", "own", "disagree"] == 0.0
        assert single[layout, "measure", "shifted", "disagree"] == 1.0
        for routing in ("own", "shifted"):
            torch.testing.assert_close(single[layout, "measure", routing], base, atol=0, rtol=0)
    torch.testing.assert_close(
        single["packed", "measure", "none"], single["rows", "measure", "none"], atol=1e-5, rtol=0
    )


def test_replay_is_obeyed_and_replaying_the_models_own_routing_changes_nothing(single: dict) -> None:
    for layout in ("rows", "packed"):
        base = single[layout, "measure", "none"]
        torch.testing.assert_close(
            single[layout, "replay", "none"], base, atol=0, rtol=0
        )  # no routing: the router's own
        torch.testing.assert_close(single[layout, "replay", "own"], base, atol=1e-6, rtol=0)
        assert (single[layout, "replay", "shifted"] - base).abs().max() > 1e-3
        assert single[layout, "replay", "own", "disagree"] == 0.0  # replaying still measures the router's own choice
        assert single[layout, "replay", "shifted", "disagree"] == 1.0
    torch.testing.assert_close(
        single["packed", "replay", "shifted"], single["rows", "replay", "shifted"], atol=1e-5, rtol=0
    )
    assert "3 MoE layers" in single["wrong_layers"]


def test_training_under_replay_reaches_the_router(single: dict) -> None:
    own, measured = single["replay_own", "metrics"], single["measure_own", "metrics"]
    for key in ("loss/total", "loss/policy", "grad_norm"):
        assert abs(own[key] - measured[key]) < 1e-6, key
    assert single["replay_own", "disagree"] == single["measure_own", "disagree"] == 0.0
    assert single["replay_shifted", "disagree"] == 1.0
    assert single["replay_shifted", "metrics"]["grad_norm"] > 0
    assert single["replay_shifted", "router_moved"] > 1e-4  # gradients flow through scores.gather(replayed)
    assert single["rl_step_disagree"] == 1.0  # train_on_batch reports routing/disagree_frac


# ---------------------------------------------------------------------------------------------
# Two ranks: pipeline stages, tensor, context and expert parallelism.


def _layouts(rank: int, world_size: int) -> dict:
    from hetrl.trainer.parallel import destroy_parallel
    from hetrl.trainer.policy import PolicyTrainer

    samples = make_samples(8, vocab=MOE.vocab_size)
    own = own_routing_of_a_fresh_model(samples)
    advantages = torch.linspace(-1, 1, 8)
    layouts = {
        "pp2": ({"pipeline_parallel": 2}, True),
        "tp2": ({"tensor_parallel": 2}, False),  # megatron trains MoE under TP only with SP (GPU): forward only
        "cp2_packed": ({"context_parallel": 2, "pack_length": 32}, True),
        "ep2": ({"expert_parallel": 2}, True),
    }
    out: dict = {}
    for layout, (update, train) in layouts.items():
        tcfg = TrainerConfig(precision="fp32", micro_batch_size=2, lr=1e-2, **update)
        for mode in ("off", "replay"):
            trainer = PolicyTrainer(MOE, tcfg, ALGO, seed=SEED, routing=mode)
            try:
                for name, routing in (("own", own), ("shifted", shifted(own))):
                    out[layout, mode, name] = trainer.compute_logprobs(trainer.make_batch(carrying(samples, routing)))
                    if trainer.routing is not None:
                        out[layout, mode, name, "disagree"] = trainer.routing.take_disagreement()
                if train:
                    batch = trainer.make_batch(carrying(samples, own)).with_advantages(advantages)
                    out[layout, mode, "train"] = trainer.train_step(batch)
                    if trainer.routing is not None:
                        out[layout, mode, "train", "disagree"] = trainer.routing.take_disagreement()
            finally:
                destroy_parallel()
    return out


def test_replay_in_every_layout(two_ranks) -> None:
    results = two_ranks.run(_layouts)
    for layout in ("pp2", "tp2", "cp2_packed", "ep2"):
        for r in results:
            base = r[layout, "off", "own"]
            assert (base != 0).sum() > 40, layout
            torch.testing.assert_close(r[layout, "off", "shifted"], base, atol=0, rtol=0)  # "off" ignores routing
            torch.testing.assert_close(r[layout, "replay", "own"], base, atol=1e-6, rtol=0, msg=layout)
            assert (r[layout, "replay", "shifted"] - base).abs().max() > 1e-3, layout
            assert r[layout, "replay", "own", "disagree"] == 0.0, layout
            assert r[layout, "replay", "shifted", "disagree"] == 1.0, layout
            if (layout, "off", "train") in r:
                for key in ("loss/total", "loss/policy", "grad_norm"):
                    assert abs(r[layout, "replay", "train"][key] - r[layout, "off", "train"][key]) < 1e-6, (layout, key)
                assert r[layout, "replay", "train", "disagree"] == 0.0, layout
        # Same log-probs on both ranks (PP: the last stage's, broadcast; TP/CP/EP: every rank's whole batch).
        torch.testing.assert_close(
            results[0][layout, "replay", "shifted"], results[1][layout, "replay", "shifted"], atol=0, rtol=0
        )
    # Every layout computes the one model: the shifted replay is the same function everywhere.
    for layout in ("tp2", "cp2_packed", "ep2"):
        torch.testing.assert_close(
            results[0][layout, "replay", "shifted"], results[0]["pp2", "replay", "shifted"], atol=1e-5, rtol=0
        )


def _recompute_under_pp2(rank: int, world_size: int) -> str:
    from hetrl.trainer.parallel import destroy_parallel
    from hetrl.trainer.policy import PolicyTrainer

    tcfg = TrainerConfig(precision="fp32", micro_batch_size=1, pipeline_parallel=2, recompute_activations=True)
    try:
        PolicyTrainer(MOE, tcfg, ALGO, seed=SEED, routing="replay")
    except ValueError as error:
        return str(error)
    finally:
        destroy_parallel()
    return "built"


def test_replay_with_recomputation_under_pp_is_refused(two_ranks) -> None:
    """Recomputation re-runs a micro-batch's forward in its backward, after 1F1B has loaded later
    micro-batches' routing: the recomputed routers would replay the wrong rows (grad norm off by 1e-5)."""
    for message in two_ranks.run(_recompute_under_pp2):
        assert "recompute_activations" in message
