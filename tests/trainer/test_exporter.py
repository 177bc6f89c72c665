"""The streaming exporter: size-bounded buckets that rebuild the full HF state dict from sharded models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_hf_convert import SMALL, read_safetensors

from hetrl.config.model import ModelConfig
from hetrl.config.trainer import TrainerConfig
from hetrl.models.hf import build_random_hf_checkpoint

BUCKET_BYTES = 30_000  # the largest tensor here (embedding, 127 x 64 fp32) is 32,512 bytes: it goes alone


def _export(
    rank: int,
    world_size: int,
    mcfg: ModelConfig,
    layout: dict,
    hf_dir: Path | None,
    dtype: torch.dtype | None,
    save_to: Path | None = None,
) -> dict:
    """Build a model (importing ``hf_dir`` if given), export it in buckets (and to ``save_to``)."""
    from hetrl.trainer.exporter import iter_hf_weight_buckets, save_hf_checkpoint
    from hetrl.trainer.hf_convert import load_hf_checkpoint
    from hetrl.trainer.model import build_gpt_model
    from hetrl.trainer.parallel import destroy_parallel, init_parallel

    tcfg = TrainerConfig(precision="fp32", **layout)
    groups = init_parallel(tcfg)
    try:
        model = build_gpt_model(mcfg, tcfg, pg_collection=groups.pg_collection, seed=21)
        if hf_dir is not None:
            load_hf_checkpoint(model, hf_dir, groups.pg_collection)
        buckets = list(iter_hf_weight_buckets(model, mcfg.vocab_size, BUCKET_BYTES, dtype, groups.pg_collection))
        if save_to is not None:
            save_hf_checkpoint(model, mcfg, save_to, pg_collection=groups.pg_collection)
        with torch.no_grad():  # training goes on while the consumer holds buckets: they must be copies
            for p in model.parameters():
                p.add_(1.0)
        return {"buckets": buckets}
    finally:
        destroy_parallel()


def bucket_bytes(bucket) -> int:
    return sum(t.numel() * t.element_size() for _, t in bucket)


@pytest.fixture(scope="module")
def qwen2_hf(tmp_path_factory) -> tuple[ModelConfig, Path]:
    cfg = ModelConfig(**SMALL, arch="qwen2")
    return cfg, build_random_hf_checkpoint(cfg, tmp_path_factory.mktemp("hf"), seed=9)


def test_tp2_buckets_are_bounded_and_rebuild_the_hf_state_dict(two_ranks, qwen2_hf) -> None:
    cfg, hf_dir = qwen2_hf
    first, second = two_ranks.run(_export, cfg, {"tensor_parallel": 2}, hf_dir, None)
    assert second["buckets"] == []  # only rank 0 receives
    buckets = first["buckets"]
    assert len(buckets) > 3
    for bucket in buckets:
        assert bucket_bytes(bucket) <= BUCKET_BYTES or len(bucket) == 1
    assert any(bucket_bytes(b) > BUCKET_BYTES for b in buckets)  # the oversized embedding went alone
    names = [name for bucket in buckets for name, _ in bucket]
    assert len(names) == len(set(names))
    exported = dict(kv for bucket in buckets for kv in bucket)
    original = read_safetensors(hf_dir)
    assert sorted(exported) == sorted(original)
    for name, tensor in original.items():
        # Bit-exact, and untouched by the in-place update made after the export.
        assert torch.equal(exported[name], tensor), name


def test_export_is_layout_independent_and_casts(two_ranks, tmp_path) -> None:
    """A random TP=2 MoE model (experts sharded over expert-TP), saved and re-imported at TP=1,
    exports the same tensors; the bf16 cast happens on the way out."""
    cfg = ModelConfig(**SMALL, arch="qwen3_moe", num_experts=4, moe_ffn_hidden_size=48)
    sharded = two_ranks.run(_export, cfg, {"tensor_parallel": 2}, None, torch.bfloat16, tmp_path)[0]["buckets"]
    single = two_ranks.run(_export, cfg, {}, tmp_path, torch.bfloat16)[0]["buckets"]
    saved = read_safetensors(tmp_path)
    as_dict = [dict(kv for bucket in buckets for kv in bucket) for buckets in (sharded, single)]
    assert len(as_dict[0]) == 2 * (9 + 3 * 4) + 3 and sorted(as_dict[0]) == sorted(as_dict[1]) == sorted(saved)
    for name, tensor in as_dict[0].items():
        assert tensor.dtype == torch.bfloat16 and saved[name].dtype == torch.float32
        assert torch.equal(tensor, saved[name].to(torch.bfloat16)), name
        assert torch.equal(tensor, as_dict[1][name]), name
