"""Context-parallel slicing: load-balanced chunks, sharded micro-batches, and user errors."""

from __future__ import annotations

import pytest
import torch
from samples import make_samples

from hetrl.trainer.batch import build_train_batch
from hetrl.trainer.context_parallel import local_positions, shard_micro_batch


def test_ranks_hold_paired_chunks_that_tile_each_span() -> None:
    held = [local_positions([(0, 16)], 4, r) for r in range(4)]
    assert held[0].tolist() == [0, 1, 14, 15]  # the cheapest and the dearest chunk under a causal mask
    assert held[3].tolist() == [6, 7, 8, 9]
    assert sorted(torch.cat(held).tolist()) == list(range(16))
    assert local_positions([(0, 4), (4, 8)], 2, 1).tolist() == [1, 2, 6, 7, 8, 9]  # two packed samples
    with pytest.raises(ValueError, match="multiple of 2 x cp = 4"):
        local_positions([(0, 10)], 2, 0)


def test_packed_samples_are_padded_one_by_one_and_sliced_per_sample() -> None:
    batch = build_train_batch(make_samples(4), micro_batch_size=4, pack_length=24)
    mb = batch.micro_batches[0]
    assert mb.tokens.shape[0] == 1 and mb.cu_seqlens.tolist() == mb.cu_seqlens_padded.tolist()
    padded = batch.with_length_multiple(4).micro_batches[0]
    assert all(length % 4 == 0 for _, length in padded.spans)
    assert torch.equal(padded.cu_seqlens, mb.cu_seqlens)  # real lengths are kept for transformer-engine
    for (old_start, _), (new_start, _), real in zip(
        mb.spans, padded.spans, (mb.cu_seqlens[1:] - mb.cu_seqlens[:-1]).tolist()
    ):
        assert torch.equal(padded.tokens[0, new_start : new_start + real], mb.tokens[0, old_start : old_start + real])
    assert torch.equal(padded.tokens.reshape(-1)[padded.gather_index], mb.tokens.reshape(-1)[mb.gather_index])
    local = shard_micro_batch(padded, 2, 1)
    keep = local_positions(padded.spans, 2, 1)
    assert local.tokens.shape[1] == padded.tokens.shape[1] // 2
    assert torch.equal(local.tokens, padded.tokens[:, keep]) and torch.equal(local.labels, padded.labels[:, keep])
    assert local.cu_seqlens_padded is padded.cu_seqlens_padded and local.gather_index is padded.gather_index
    assert shard_micro_batch(padded, 1, 0) is padded
