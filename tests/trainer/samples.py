"""Deterministic synthetic samples for trainer tests (varied prompt/completion lengths, masks)."""

from __future__ import annotations

import random

from hetrl.records import Sample, SampleMeta


def make_samples(
    n: int, vocab: int = 128, seed: int = 0, max_prompt: int = 9, max_completion: int = 11
) -> list[Sample]:
    """``n`` samples in groups of 2, with an observation span (loss_mask 0) in some completions."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p, c = rng.randint(1, max_prompt), rng.randint(0 if i == 3 else 1, max_completion)
        mask = [0 if (i % 3 == 1 and 2 <= j < 4) else 1 for j in range(c)]
        out.append(
            Sample(
                sample_id=f"s{i}",
                group_id=f"g{i // 2}",
                task_name="t",
                prompt_ids=[rng.randrange(1, vocab) for _ in range(p)],
                completion_ids=[rng.randrange(1, vocab) for _ in range(c)],
                loss_mask=mask,
                logprobs=[-rng.random() * 3 * m for m in mask],
                versions=[0] * c,
            )
        )
    return out


def make_step(n: int, vocab: int = 128, seed: int = 0) -> list[Sample]:
    """:func:`make_samples` rewarded: -0.5, 0.5, 1.5 in turn (every group of 2 has a spread)."""
    samples = make_samples(n, vocab=vocab, seed=seed)
    for i, s in enumerate(samples):
        s.reward = float(i % 3) - 0.5
    return samples


def whole_step(samples: list[Sample]) -> tuple[list[SampleMeta], dict[int, Sample]]:
    """``train_on_batch``'s ``(metas, shard)`` for a rank that holds every sample of the step."""
    return [SampleMeta.of(s) for s in samples], dict(enumerate(samples))
