"""``algorithm:`` — which RL objective the trainer optimises and how advantages are formed.

Each named algorithm is a composition of the loss/advantage functions in ``hetrl.trainer``;
the remaining keys tune those pieces (see docs/recipe_keys.md).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from hetrl.config.base import Section

AlgorithmName = Literal["grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo", "reinforce_pp", "ppo"]
LossAggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
AdvantageEstimator = Literal["grpo", "grpo_no_std", "rloo", "reinforce_pp", "gae"]
# IcePop's lower bound alpha (Ling team 2025): a token the engine finds twice as likely as the
# trainer does is dropped. The paper's upper bound, 5, is looser than is_threshold's default 2.
_ICEPOP_THRESHOLD_LOW = 0.5


class AlgorithmConfig(Section):
    name: AlgorithmName = Field("grpo", description="RL algorithm; sets the loss and advantage defaults below.")
    group_size: int = Field(8, ge=1, description="Responses sampled per prompt (GRPO group size, n).")
    advantage: AdvantageEstimator | None = Field(
        None,
        description="Advantage estimator; null picks the algorithm's own (grpo->grpo, dr_grpo->grpo_no_std, "
        "rloo->rloo, ppo->gae, ...).",
    )
    loss_aggregation: LossAggregation | None = Field(
        None,
        description="How per-token losses are reduced; null picks the algorithm's own "
        "(dr_grpo->seq-mean-token-sum-norm, gspo->seq-mean-token-mean, else token-mean).",
    )
    clip_low: float = Field(0.2, ge=0.0, le=1.0, description="PPO ratio clip below 1 (ratio >= 1 - clip_low).")
    clip_high: float | None = Field(
        None,
        ge=0.0,
        le=10.0,
        description="PPO ratio clip above 1 (ratio <= 1 + clip_high); null -> 0.28 for dapo (clip-higher), else 0.2.",
    )
    dual_clip: float | None = Field(
        None, gt=1.0, description="Dual-clip constant c (> 1) bounding the loss for negative advantages; null disables."
    )
    cispo_clip_high: float = Field(
        5.0, gt=0.0, description="CISPO: upper truncation of the (stop-gradient) IS weight, 1 + this."
    )
    gspo_clip: float = Field(
        3e-4,
        gt=0.0,
        description="GSPO: lower clip range of the sequence-level (length-normalised) ratio (s >= 1 - this).",
    )
    gspo_clip_high: float = Field(
        4e-4,
        gt=0.0,
        description="GSPO: upper clip range of the sequence-level ratio (s <= 1 + this); the paper uses 3e-4 / 4e-4.",
    )
    kl_coef: float = Field(
        0.0, ge=0.0, description="Weight of the KL(policy || reference) term; 0 disables the reference model."
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="KL estimator (Schulman's k1/k2/k3).")
    kl_in_reward: bool = Field(
        False,
        description="Fold the KL penalty into the reward (per token, -kl_coef x KL of the "
        "policy the step starts from to the reference, computed on the trainer) instead of adding it to the loss.",
    )
    entropy_coef: float = Field(0.0, ge=0.0, description="Entropy bonus weight.")
    is_correction: Literal["none", "truncated", "masked", "icepop"] = Field(
        "truncated",
        description="Importance-sampling correction of the train/inference mismatch, w = pi_trainer/pi_engine: "
        "truncated "
        "min(w, is_threshold) (TIS); masked w, or 0 where w > is_threshold or w < is_threshold_low (MIS); icepop "
        "the same two-sided mask per token, is_threshold_low defaulting to 0.5 (IcePop; the paper uses 0.5 / 5).",
    )
    is_level: Literal["token", "sequence", "geometric"] = Field(
        "token",
        description="What w is a ratio of: token, each token's; sequence, the response's (product of its token "
        "ratios); "
        "geometric, their per-token geometric mean over the response (length-normalised, so long responses "
        "are not rejected for their length). icepop is token-level only.",
    )
    is_threshold: float = Field(
        2.0,
        gt=1.0,
        description="Truncation cap (truncated) or upper rejection bound (masked, icepop) of the IS weight.",
    )
    is_threshold_low: float | None = Field(
        None,
        gt=0.0,
        lt=1.0,
        description="Lower rejection bound of the IS weight (masked, icepop): w below it is rejected too; null -> "
        "none for "
        "masked, 0.5 for icepop.",
    )
    dynamic_sampling: bool | None = Field(
        None,
        description="DAPO dynamic sampling: drop groups whose rewards are all equal and refill; null -> on for dapo "
        "only.",
    )
    overlong_buffer: int = Field(
        0,
        ge=0,
        description="DAPO soft overlong punishment: tokens before max_tokens where the penalty ramps in (0 = off).",
    )
    overlong_penalty: float = Field(1.0, ge=0.0, description="DAPO overlong penalty at max_tokens.")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount for GAE (ppo) and the REINFORCE++ return-to-go.")
    lam: float = Field(0.95, ge=0.0, le=1.0, description="GAE lambda (ppo).")
    value_clip: float = Field(0.2, gt=0.0, description="PPO value-function clip range.")

    @model_validator(mode="after")
    def _check_combinations(self) -> AlgorithmConfig:
        if self.advantage == "gae" and self.name != "ppo":
            raise ValueError("advantage 'gae' needs a value model: use algorithm.name=ppo")
        if self.name == "ppo" and self.advantage not in (None, "gae"):
            raise ValueError(f"algorithm.name=ppo uses advantage 'gae', got {self.advantage!r}")
        if self.resolved_advantage in ("grpo", "grpo_no_std", "rloo") and self.group_size < 2:
            raise ValueError(
                f"advantage {self.resolved_advantage!r} compares responses within a group: algorithm.group_size must "
                f"be >= 2, got {self.group_size}"
            )
        ppo_only = [
            f"algorithm.{key}"
            for key in ("lam", "value_clip")
            if getattr(self, key) != type(self).model_fields[key].default
        ]
        if ppo_only and self.name != "ppo":
            raise ValueError(
                f"{', '.join(ppo_only)} set, but only algorithm.name=ppo (GAE, a value model) reads them: remove them"
            )
        if self.kl_in_reward and self.kl_coef == 0:
            raise ValueError(
                "algorithm.kl_in_reward=true folds kl_coef x KL into the reward, but algorithm.kl_coef=0 leaves "
                "nothing to fold "
                "(and no reference model): set algorithm.kl_coef > 0, or kl_in_reward=false"
            )
        if self.is_correction == "icepop" and self.is_level != "token":
            raise ValueError(
                f"algorithm.is_correction=icepop masks single tokens, but algorithm.is_level={self.is_level!r}: use "
                "is_level=token, or is_correction=masked with is_threshold_low for a two-sided sequence-level mask"
            )
        if self.is_threshold_low is not None and self.is_correction not in ("masked", "icepop"):
            raise ValueError(
                f"algorithm.is_threshold_low set, but algorithm.is_correction={self.is_correction!r} has no lower "
                "bound (only masked and icepop read it): remove it"
            )
        return self

    @property
    def resolved_is_threshold_low(self) -> float | None:
        """The lower IS rejection bound after applying the correction's default (icepop: 0.5; else none)."""
        if self.is_threshold_low is not None or self.is_correction != "icepop":
            return self.is_threshold_low
        return _ICEPOP_THRESHOLD_LOW

    @property
    def resolved_advantage(self) -> AdvantageEstimator:
        """The advantage estimator after applying the algorithm's default."""
        defaults: dict[str, AdvantageEstimator] = {
            "dr_grpo": "grpo_no_std",
            "rloo": "rloo",
            "reinforce_pp": "reinforce_pp",
            "ppo": "gae",
        }
        return self.advantage or defaults.get(self.name, "grpo")

    @property
    def resolved_loss_aggregation(self) -> LossAggregation:
        """The loss aggregation after applying the algorithm's default."""
        defaults: dict[str, LossAggregation] = {"dr_grpo": "seq-mean-token-sum-norm", "gspo": "seq-mean-token-mean"}
        return self.loss_aggregation or defaults.get(self.name, "token-mean")

    @property
    def resolved_clip_high(self) -> float:
        """The upper PPO clip after applying the algorithm's default (DAPO's clip-higher: 0.28)."""
        if self.clip_high is not None:
            return self.clip_high
        return 0.28 if self.name == "dapo" else 0.2

    @property
    def resolved_dynamic_sampling(self) -> bool:
        """Whether DAPO dynamic sampling is on, after applying the algorithm's default."""
        return self.name == "dapo" if self.dynamic_sampling is None else self.dynamic_sampling
