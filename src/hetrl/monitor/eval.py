"""Evaluation metrics over k samples per held-out prompt: pass@k and mean@k.

pass@k is the probability that at least one of k samples is correct. Estimating it as "did any of
the first k pass" is high-variance and, averaged over prompts, biased for k < n; Chen et al. 2021
("Evaluating Large Language Models Trained on Code", eq. 1) draw n >= k samples, count c correct,
and use the unbiased estimator

    pass@k = 1 - C(n - c, k) / C(n, k),

computed here as ``1 - prod_{i=n-c+1}^{n} (1 - k / i)`` to stay exact in floating point for large
n. mean@k is the mean reward of the samples of a prompt, averaged over prompts (the usual "avg@k"
of reasoning benchmarks): for 0/1 rewards it is pass@1 estimated from k samples.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np

from hetrl.monitor import names
from hetrl.records import SampleMeta


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt with ``c`` correct among ``n`` samples (Chen et al. 2021)."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n samples per prompt, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_at_k(rewards_per_prompt: Sequence[Sequence[float]]) -> float:
    """Mean over prompts of the mean reward of each prompt's samples."""
    if not rewards_per_prompt or any(len(r) == 0 for r in rewards_per_prompt):
        raise ValueError("mean@k needs at least one prompt and one sample per prompt")
    return float(np.mean([np.mean(r) for r in rewards_per_prompt]))


def eval_metrics(
    samples: Sequence[SampleMeta],
    ks: Sequence[int],
    is_correct: Callable[[SampleMeta], bool] = lambda s: s.reward >= 1.0,
) -> dict[str, float]:
    """``eval/<task>/pass@<k>`` and ``eval/<task>/mean@<k>`` for each task in ``samples``.

    Samples are grouped into prompts by ``group_id``; each prompt must have at least ``max(ks)``
    samples. The default correctness test is "total reward >= 1" (binary verifiers); pass a
    predicate for graded rewards. pass@k uses all n samples of a prompt (the unbiased estimator);
    mean@k averages each prompt's first k samples, so it is literally the mean over k samples.
    """
    groups: dict[tuple[str, str], list[SampleMeta]] = defaultdict(list)
    for s in samples:
        groups[(s.task_name, s.group_id)].append(s)
    by_task: dict[str, list[list[SampleMeta]]] = defaultdict(list)
    for (task, _), group in groups.items():
        by_task[task].append(group)
    out: dict[str, float] = {}
    for task, prompts in sorted(by_task.items()):
        for k in ks:
            short = [len(g) for g in prompts if len(g) < k]
            if short:
                raise ValueError(
                    f"task {task!r}: pass@{k} needs >= {k} samples per prompt, some prompts have {min(short)}"
                )
            scores = [pass_at_k(len(g), sum(bool(is_correct(s)) for s in g), k) for g in prompts]
            out[names.eval_pass_at(names.segment(task), k)] = float(np.mean(scores))
            out[names.eval_mean_at(names.segment(task), k)] = mean_at_k([[s.reward for s in g[:k]] for g in prompts])
    return out
