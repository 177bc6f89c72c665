"""Train/inference mismatch: how far the engine's sampling policy is from the trainer's policy.

The engine (vLLM, bf16 kernels, different reductions) and the trainer (Megatron) compute
log-probabilities of the *same* sampled tokens under nominally the same weights; they never agree
exactly, and when they drift apart the policy gradient becomes silently off-policy. With
``log_r = log pi_trainer(y_t) - log pi_engine(y_t)`` for each sampled policy token ``y_t``:

* ``mismatch/prob_ratio_mean`` = mean of ``r = exp(log_r)``. Tokens were sampled from the engine,
  so ``E_engine[r] = 1`` exactly when both policies agree on the support; drift moves it off 1.
* ``mismatch/k3_kl`` = mean of ``r - 1 - log_r`` (Schulman's k3 estimator, always >= 0) of
  ``KL(pi_engine || pi_trainer)``, unbiased under engine sampling.
* ``mismatch/max_abs_logprob_diff`` = ``max |log_r|``: the single worst token, which is what
  blows up importance weights.

Only policy tokens (``loss_mask == 1``) count: environment observation tokens were not sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hetrl.monitor import names


def token_log_ratio(engine_logprobs: Sequence[float], trainer_logprobs: Sequence[float]) -> np.ndarray:
    """Per-token ``log pi_trainer - log pi_engine`` (float64) for one sample."""
    engine = np.asarray(engine_logprobs, dtype=np.float64)
    trainer = np.asarray(trainer_logprobs, dtype=np.float64)
    if engine.shape != trainer.shape:
        raise ValueError(f"engine and trainer log-probs differ in length: {engine.shape[0]} vs {trainer.shape[0]}")
    return trainer - engine


@dataclass(frozen=True)
class MismatchTotals:
    """What the ``mismatch/*`` metrics are made of over some policy tokens: the trainer adds up its data-parallel
    replicas' totals (sums and counts add, maxima max) and so reports the metrics of the whole step."""

    num_tokens: int
    ratio_sum: float  # sum of r
    k3_sum: float  # sum of r - 1 - log_r
    max_abs_log_ratio: float

    def metrics(self) -> dict[str, float]:
        """The three metrics; empty without a policy token, so a caller never logs a meaningless 0."""
        if not self.num_tokens:
            return {}
        return {
            names.MISMATCH_PROB_RATIO_MEAN: self.ratio_sum / self.num_tokens,
            names.MISMATCH_K3_KL: self.k3_sum / self.num_tokens,
            names.MISMATCH_MAX_ABS_LOGPROB_DIFF: self.max_abs_log_ratio,
        }


def mismatch_totals(
    engine_logprobs: Sequence[Sequence[float]],
    trainer_logprobs: Sequence[Sequence[float]],
    loss_masks: Sequence[Sequence[int]] | None = None,
) -> MismatchTotals:
    """:class:`MismatchTotals` over a batch of samples (lists of per-token log-probs); ``loss_masks`` selects
    policy tokens (all tokens when None)."""
    if len(engine_logprobs) != len(trainer_logprobs):
        raise ValueError(f"got {len(engine_logprobs)} engine and {len(trainer_logprobs)} trainer log-prob lists")
    if loss_masks is not None and len(loss_masks) != len(engine_logprobs):
        raise ValueError(f"got {len(loss_masks)} loss masks for {len(engine_logprobs)} samples")
    chunks = []
    for i, (eng, tr) in enumerate(zip(engine_logprobs, trainer_logprobs)):
        log_r = token_log_ratio(eng, tr)
        if loss_masks is not None:
            mask = np.asarray(loss_masks[i], dtype=bool)
            if mask.shape != log_r.shape:
                raise ValueError(f"sample {i}: loss mask has {mask.shape[0]} entries for {log_r.shape[0]} tokens")
            log_r = log_r[mask]
        chunks.append(log_r)
    log_r = np.concatenate(chunks) if chunks else np.zeros(0)
    if log_r.size == 0:
        return MismatchTotals(0, 0.0, 0.0, 0.0)
    ratio = np.exp(log_r)
    return MismatchTotals(
        int(log_r.size), float(ratio.sum()), float((ratio - 1.0 - log_r).sum()), float(np.abs(log_r).max())
    )


def mismatch_metrics(
    engine_logprobs: Sequence[Sequence[float]],
    trainer_logprobs: Sequence[Sequence[float]],
    loss_masks: Sequence[Sequence[int]] | None = None,
) -> dict[str, float]:
    """The three ``mismatch/*`` metrics over a batch of samples (see :func:`mismatch_totals`); empty without a
    policy token."""
    return mismatch_totals(engine_logprobs, trainer_logprobs, loss_masks).metrics()
