"""Per-token log-probs: vocab-parallel (TP=2 == TP=1), CP=2 == CP=1, padding/packing/micro-batching invariant."""

from __future__ import annotations

import torch
from samples import make_samples

from hetrl.config.model import ModelConfig
from hetrl.config.trainer import TrainerConfig

MODEL = ModelConfig(arch="qwen3", vocab_size=130)  # 130: padded to 130/132 by TP, exercises the pad rows


def _logprobs(tcfg: TrainerConfig, *, micro_batch_size: int, pack_length: int | None, temperature: float = 1.0):
    from hetrl.trainer.batch import build_train_batch
    from hetrl.trainer.logprobs import forward_logprobs
    from hetrl.trainer.model import build_gpt_model
    from hetrl.trainer.parallel import destroy_parallel, init_parallel

    groups = init_parallel(tcfg)
    try:
        model = build_gpt_model(MODEL, tcfg, pg_collection=groups.pg_collection, seed=3)
        batch = build_train_batch(
            make_samples(7, vocab=MODEL.vocab_size), micro_batch_size=micro_batch_size, pack_length=pack_length
        )
        return forward_logprobs(model, batch, groups, temperature=temperature, with_entropy=True)
    finally:
        destroy_parallel()


def _tp_vs_tp1(rank: int, world_size: int) -> dict:
    tp1 = _logprobs(TrainerConfig(precision="fp32"), micro_batch_size=3, pack_length=None)
    tp2 = _logprobs(TrainerConfig(precision="fp32", tensor_parallel=2), micro_batch_size=3, pack_length=None)
    packed = _logprobs(TrainerConfig(precision="fp32"), micro_batch_size=2, pack_length=24)
    single = _logprobs(TrainerConfig(precision="fp32"), micro_batch_size=1, pack_length=None, temperature=0.7)
    cp2 = _logprobs(TrainerConfig(precision="fp32", context_parallel=2), micro_batch_size=3, pack_length=None)
    cp2_packed = _logprobs(TrainerConfig(precision="fp32", context_parallel=2), micro_batch_size=2, pack_length=24)
    tp2_packed = _logprobs(TrainerConfig(precision="fp32", tensor_parallel=2), micro_batch_size=2, pack_length=24)
    return {
        "tp1": tp1,
        "tp2": tp2,
        "packed": packed,
        "single_t07": single,
        "cp2": cp2,
        "cp2_packed": cp2_packed,
        "tp2_packed": tp2_packed,
    }


def _reference_logprobs(rank: int, world_size: int, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample alone through the TP=1 model, log_softmax + gather over the real vocab."""
    from hetrl.trainer.model import build_gpt_model
    from hetrl.trainer.parallel import destroy_parallel, init_parallel

    tcfg = TrainerConfig(precision="fp32")
    groups = init_parallel(tcfg)
    try:
        model = build_gpt_model(MODEL, tcfg, pg_collection=groups.pg_collection, seed=3).eval()
        samples = make_samples(7, vocab=MODEL.vocab_size)
        width = max(len(s.completion_ids) for s in samples)
        lp, ent = torch.zeros(len(samples), width), torch.zeros(len(samples), width)
        with torch.no_grad():
            for i, s in enumerate(samples):
                ids = torch.tensor([s.prompt_ids + s.completion_ids])
                logits = model(ids, torch.arange(ids.shape[1])[None], None)[0].float() / temperature
                logp = torch.log_softmax(logits, -1)  # over the padded vocab, as the engine would with it
                p, c = len(s.prompt_ids), len(s.completion_ids)
                rows = logp[p - 1 : p - 1 + c]
                m = torch.tensor(s.loss_mask, dtype=torch.float32)
                lp[i, :c] = rows.gather(-1, ids[0, p:, None])[:, 0] * m
                ent[i, :c] = -(rows.exp() * rows).sum(-1) * m
        return lp, ent
    finally:
        destroy_parallel()


def test_tp2_and_cp2_match_tp1_and_packing_and_microbatching_do_not_change_logprobs(two_ranks) -> None:
    results = two_ranks.run(_tp_vs_tp1)
    ref_lp, ref_ent = two_ranks.run(_reference_logprobs, 1.0)[0]
    ref_lp07, ref_ent07 = two_ranks.run(_reference_logprobs, 0.7)[0]
    for r in results:
        tp1_lp, tp1_ent = r["tp1"]
        assert tp1_lp.shape == ref_lp.shape
        torch.testing.assert_close(tp1_lp, ref_lp, atol=1e-5, rtol=0)
        torch.testing.assert_close(tp1_ent, ref_ent, atol=1e-5, rtol=0)
        for key in ("tp2", "packed", "cp2", "cp2_packed", "tp2_packed"):
            torch.testing.assert_close(
                r[key][0], tp1_lp, atol=1e-5, rtol=0, msg=lambda m, key=key: f"{key} logprobs: {m}"
            )
            torch.testing.assert_close(
                r[key][1], tp1_ent, atol=1e-5, rtol=0, msg=lambda m, key=key: f"{key} entropy: {m}"
            )
        torch.testing.assert_close(r["single_t07"][0], ref_lp07, atol=1e-5, rtol=0)
        torch.testing.assert_close(r["single_t07"][1], ref_ent07, atol=1e-5, rtol=0)
    assert (ref_lp != 0).sum() > 40  # the comparison covers real tokens
