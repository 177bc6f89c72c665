"""Context-parallel slicing: load-balanced chunks, sharded micro-batches, and user errors."""

from __future__ import annotations

import pytest
import torch

from hetrl.trainer.batch import build_train_batch
from hetrl.trainer.context_parallel import local_positions, shard_micro_batch
from samples import make_samples


def test_ranks_hold_paired_chunks_that_tile_the_row() -> None:
    held = [local_positions(16, 4, r) for r in range(4)]
    assert held[0].tolist() == [0, 1, 14, 15]  # the cheapest and the dearest chunk under a causal mask
    assert held[3].tolist() == [6, 7, 8, 9]
    assert sorted(torch.cat(held).tolist()) == list(range(16))
    with pytest.raises(ValueError, match="multiple of 2 x cp = 4"):
        local_positions(10, 2, 0)


def test_a_packed_micro_batch_is_sliced_by_columns_and_query_rows() -> None:
    batch = build_train_batch(make_samples(4), micro_batch_size=4, pack_length=24).with_length_multiple(4)
    mb = batch.micro_batches[0]
    length = mb.tokens.shape[1]
    assert length % 4 == 0
    local = shard_micro_batch(mb, 2, 1)
    keep = local_positions(length, 2, 1)
    assert torch.equal(local.tokens, mb.tokens[:, keep]) and torch.equal(local.labels, mb.labels[:, keep])
    assert local.attention_mask.shape == (mb.tokens.shape[0], 1, length // 2, length)  # local queries, every key
    assert torch.equal(local.attention_mask, mb.attention_mask[:, :, keep, :])
    assert local.gather_index is mb.gather_index  # sample space stays whole
    assert shard_micro_batch(mb, 1, 0) is mb
