"""Shaping terms: format, DAPO overlong penalty, length and repetition penalties.

Each is a reward function ``f(sample) -> RewardValue``; penalties are <= 0 and meant to be
added with a positive weight (or used at weight 0 as metrics).
"""

from __future__ import annotations

import re

from hetrl.reward.base import RewardValue, Scorable, completion_tokens


class FormatReward:
    """1.0 when the completion matches ``pattern`` (default: a closed <think> block then a \\boxed{} answer), else 0.

    ``re.fullmatch`` with DOTALL over the stripped completion, so text outside the format fails it.
    """

    DEFAULT = r"<think>.*?</think>\s*.*\\boxed\{.+\}.*"

    def __init__(self, pattern: str = DEFAULT) -> None:
        self.pattern = re.compile(pattern, re.S)

    def __call__(self, sample: Scorable) -> RewardValue:
        ok = self.pattern.fullmatch(sample.completion_text.strip()) is not None
        return RewardValue(float(ok), [] if ok else ["format/mismatch"])


class OverlongPenalty:
    """DAPO soft overlong punishment (Yu et al. 2025, eq. 13), on L = completion tokens:

    R(L) = 0                          if L <= L_max - L_cache
         = (L_max - L_cache - L) / L_cache * penalty   if L_max - L_cache < L <= L_max
         = -penalty                   if L > L_max  (or the sample was cut at max_tokens)
    """

    def __init__(self, max_tokens: int, buffer_tokens: int, penalty: float = 1.0) -> None:
        if not 0 < buffer_tokens <= max_tokens:
            raise ValueError(
                f"overlong penalty needs 0 < buffer_tokens <= max_tokens, got {buffer_tokens}, {max_tokens}"
            )
        self.max_tokens, self.buffer, self.penalty = max_tokens, buffer_tokens, penalty

    def __call__(self, sample: Scorable) -> RewardValue:
        n = completion_tokens(sample)
        start = self.max_tokens - self.buffer
        if n > self.max_tokens or sample.finish_reason == "length":
            return RewardValue(-self.penalty, ["length/truncated"])
        return RewardValue(min(0.0, (start - n) / self.buffer * self.penalty))


class LengthPenalty:
    """-coef * max(0, L - target) / target: linear beyond a target length, 0 below it."""

    def __init__(self, target_tokens: int, coef: float = 1.0) -> None:
        if target_tokens <= 0:
            raise ValueError(f"target_tokens must be > 0, got {target_tokens}")
        self.target, self.coef = target_tokens, coef

    def __call__(self, sample: Scorable) -> RewardValue:
        excess = max(0, completion_tokens(sample) - self.target)
        return RewardValue(-self.coef * excess / self.target)


class RepetitionPenalty:
    """-coef * (fraction of repeated n-grams among the completion's n-grams) when above ``threshold``.

    A degenerate loop ("the the the ...") repeats almost every n-gram; ordinary text repeats few.
    """

    def __init__(self, ngram: int = 4, threshold: float = 0.3, coef: float = 1.0) -> None:
        if ngram < 1 or not 0 <= threshold < 1:
            raise ValueError(f"repetition penalty needs ngram >= 1 and 0 <= threshold < 1, got {ngram}, {threshold}")
        self.n, self.threshold, self.coef = ngram, threshold, coef

    def __call__(self, sample: Scorable) -> RewardValue:
        ids = sample.completion_ids
        if ids is None:  # a view sent without them: RewardConfig.reads_completion_ids does not name this function
            raise ValueError("the repetition penalty reads token ids, and this sample came without them")
        grams = [tuple(ids[i : i + self.n]) for i in range(len(ids) - self.n + 1)]
        if not grams:
            return RewardValue(0.0, metrics={"repetition/ratio": 0.0})
        ratio = 1.0 - len(set(grams)) / len(grams)
        score = -self.coef * ratio if ratio > self.threshold else 0.0
        return RewardValue(score, ["repetition/degenerate"] if score else [], {"repetition/ratio": ratio})


class NumericCloseness:
    """Partial credit for a numeric answer: ``max(0, 1 - |answer - reference| / scale)``.

    A dense signal for policies that rarely hit the exact answer yet (tiny models, the start of a
    run): GRPO then compares "closer" with "further" instead of seeing all-zero groups. The answer
    must stand inside ``<tag>...</tag>`` (the last one counts); anything that is not a plain number
    scores 0, so the term cannot be earned by formatting tricks.
    """

    def __init__(self, scale: float = 10.0, answer_tag: str = "answer") -> None:
        if scale <= 0:
            raise ValueError(f"scale must be positive, got {scale}")
        self.scale = scale
        self.pattern = re.compile(rf"<{re.escape(answer_tag)}>\s*(-?\d+(?:\.\d+)?)\s*</{re.escape(answer_tag)}>")

    def __call__(self, sample: Scorable) -> RewardValue:
        found = self.pattern.findall(sample.completion_text)
        try:
            reference = float(str(sample.answer).strip())
        except ValueError:
            return RewardValue(0.0, ["closeness/reference_not_numeric"])
        if not found:
            return RewardValue(0.0, ["closeness/no_number"])
        return RewardValue(max(0.0, 1.0 - abs(float(found[-1]) - reference) / self.scale))
