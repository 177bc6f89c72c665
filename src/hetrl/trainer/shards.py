"""Which samples of a step each trainer data-parallel replica trains on, computed from metadata alone.

Importable without torch: the orchestrator (which sends each replica its shard's payloads) and the
trainer (which builds micro-batches from them) run the same functions on the same metadata, so they
agree on every index without exchanging one. A step is split into ``num_minibatches`` contiguous
minibatches (one optimizer step each), and each minibatch is dealt over the ``dp_size`` replicas:
equal sample counts (+-1), balanced model tokens; with shared prompts a GRPO group's samples with one
prompt stay on one replica (they are one model row, :mod:`hetrl.trainer.shared_prompts`).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from hetrl.records import SampleMeta


def minibatch_bounds(num_samples: int, num_minibatches: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of each contiguous minibatch of a step's samples."""
    if num_minibatches > num_samples:
        raise ValueError(f"trainer.updates_per_batch={num_minibatches} exceeds the {num_samples} samples of a step")
    edges = [num_samples * k // num_minibatches for k in range(num_minibatches + 1)]
    return list(zip(edges, edges[1:]))


def balanced_bins(sizes: Sequence[int], num_bins: int, capacity: int | None = None) -> list[list[int]]:
    """Indices of ``sizes`` split into ``num_bins`` bins of about equal total size (LPT heuristic).

    Largest items first, each to the currently lightest bin that has room (``capacity`` items per
    bin). Within a bin the original order is kept, so results stay deterministic.
    """
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")
    if capacity is not None and capacity * num_bins < len(sizes):
        raise ValueError(f"{len(sizes)} items do not fit in {num_bins} bins of {capacity}")
    heap = [(0, b) for b in range(num_bins)]
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    for i in sorted(range(len(sizes)), key=lambda k: (-sizes[k], k)):
        load, b = heapq.heappop(heap)
        bins[b].append(i)
        if capacity is None or len(bins[b]) < capacity:  # a full bin leaves the heap
            heapq.heappush(heap, (load + sizes[i], b))
    return [sorted(b) for b in bins]


def deal(
    metas: Sequence[SampleMeta], dp_size: int, tokens_per_image: int | None = None, shared_prompts: bool = False
) -> list[list[int]]:
    """Indices (into ``metas``, one minibatch) of the samples each replica trains on, by data-parallel rank."""
    units: list[list[int]]
    if shared_prompts:
        rows: dict[tuple[str, int], list[int]] = {}
        for i, m in enumerate(metas):
            rows.setdefault((m.group_id, m.prompt_key), []).append(i)
        units = list(rows.values())
    else:
        units = [[i] for i in range(len(metas))]
    if len(units) < dp_size:
        what = "groups" if shared_prompts else "samples"
        raise ValueError(f"{len(units)} {what} cannot feed {dp_size} data-parallel ranks")
    sizes = [sum(metas[i].model_length(tokens_per_image) for i in unit) for unit in units]
    bins = balanced_bins(sizes, dp_size, capacity=-(-len(units) // dp_size))
    return [sorted(i for u in chosen for i in units[u]) for chosen in bins]


def shard_indices(
    metas: Sequence[SampleMeta],
    dp_rank: int,
    dp_size: int,
    tokens_per_image: int | None = None,
    shared_prompts: bool = False,
) -> list[int]:
    """Indices (into ``metas``, one minibatch) of the samples replica ``dp_rank`` trains on."""
    return deal(metas, dp_size, tokens_per_image, shared_prompts)[dp_rank]


def step_shards(
    metas: Sequence[SampleMeta],
    num_minibatches: int,
    dp_size: int,
    tokens_per_image: int | None = None,
    shared_prompts: bool = False,
) -> list[list[int]]:
    """Indices (into the step's ``metas``) of every sample each replica trains on, over all minibatches, by
    data-parallel rank: how the orchestrator deals a step (one pass, whatever the number of replicas)."""
    shards: list[list[int]] = [[] for _ in range(dp_size)]
    for a, b in minibatch_bounds(len(metas), num_minibatches):
        for shard, indices in zip(shards, deal(metas[a:b], dp_size, tokens_per_image, shared_prompts)):
            shard.extend(a + i for i in indices)
    return shards


def step_shard(
    metas: Sequence[SampleMeta],
    num_minibatches: int,
    dp_rank: int,
    dp_size: int,
    tokens_per_image: int | None = None,
    shared_prompts: bool = False,
) -> list[int]:
    """Indices (into the step's ``metas``) of every sample replica ``dp_rank`` trains on, over all minibatches."""
    return step_shards(metas, num_minibatches, dp_size, tokens_per_image, shared_prompts)[dp_rank]
