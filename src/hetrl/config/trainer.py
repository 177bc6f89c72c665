"""``trainer:`` — Megatron-core parallelism and optimisation of the policy."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from hetrl.config.base import Section


class TrainerConfig(Section):
    tensor_parallel: int = Field(1, ge=1, description="Tensor-parallel size (TP) of the trainer.")
    pipeline_parallel: int = Field(1, ge=1, description="Pipeline-parallel size (PP).")
    expert_parallel: int = Field(1, ge=1, description="Expert-parallel size (EP), MoE models only.")
    context_parallel: int = Field(
        1,
        ge=1,
        description="Context-parallel size (CP) for long sequences: each rank holds 2 of 2 x CP chunks of every row "
        "(all-gather attention on the local spec, transformer-engine's own CP on GPU).",
    )
    sequence_parallel: bool = Field(
        False,
        description="Megatron sequence parallelism (needs tensor_parallel > 1; CPU runs use hetrl's sequence-parallel "
        "norms).",
    )
    precision: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="Training precision. bf16: bf16 weights and compute with fp32 master weights, gradients and "
        "optimizer state (megatron's mixed precision); on GPUs, and on CPUs with native bf16 (AVX512-BF16 or AMX; "
        "elsewhere emulated and slower than fp32, which the trainer warns of).",
    )
    transformer_impl: Literal["auto", "local", "transformer_engine"] = Field(
        "auto", description="Layer implementation: transformer_engine on GPU when installed, local otherwise (auto)."
    )
    micro_batch_size: int = Field(
        4,
        ge=1,
        description="Rows per forward/backward pass on one DP rank: samples, packed bins (pack_length) or groups "
        "(shared_prompts).",
    )
    lr: float = Field(1e-6, gt=0.0, description="Peak learning rate.")
    min_lr: float = Field(0.0, ge=0.0, description="Learning rate at the end of the decay.")
    lr_warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear warmup.")
    lr_decay_style: Literal["constant", "linear", "cosine"] = Field("constant", description="Decay after warmup.")
    lr_decay_steps: int | None = Field(
        None,
        ge=1,
        description="Optimizer step at which the decay reaches min_lr; null = the run's total optimizer steps.",
    )
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0, description="AdamW beta1.")
    adam_beta2: float = Field(0.999, ge=0.0, lt=1.0, description="AdamW beta2.")
    adam_eps: float = Field(1e-8, gt=0.0, description="AdamW epsilon.")
    grad_clip: float = Field(1.0, ge=0.0, description="Global grad-norm clip (0 disables).")
    distributed_optimizer: bool = Field(
        True, description="Shard optimizer state across DP ranks (Megatron distributed optimizer)."
    )
    updates_per_batch: int = Field(
        1,
        ge=1,
        description="Optimizer steps per rollout batch: the batch is split into this many minibatches (whole groups), "
        "all scored by the policy the step started from (PPO's ratio then departs from 1).",
    )
    pack_length: int | None = Field(
        None,
        ge=16,
        description="Pack samples into bins of at most this many tokens; a micro-batch of micro_batch_size bins runs "
        "as one THD row (attention stays within each sample). null = one sample per row, right-padded.",
    )
    shared_prompts: bool = Field(
        False,
        description="Train each prompt once for all its completions: each GRPO group is a tree of its prompt and then "
        "every completion of it, each attending to the prompt and to itself (tree attention; positions continue from "
        "the "
        "prompt in every branch), a micro-batch's trees in one row, so a GRPO group of G samples costs one prompt "
        "instead of G. The same log-probs and "
        "gradients as one row per sample, up to rounding. micro_batch_size then counts groups. Runs on the local layer "
        "spec (transformer_impl auto picks it); not with context or sequence parallelism, pack_length, a "
        "vision-language "
        "policy or MoE routing replay.",
    )
    recompute_activations: bool = Field(False, description="Activation recomputation to save memory.")

    @model_validator(mode="after")
    def _check(self) -> TrainerConfig:
        if self.sequence_parallel and self.tensor_parallel == 1:
            raise ValueError("trainer.sequence_parallel=true needs trainer.tensor_parallel > 1")
        if self.min_lr > self.lr:
            raise ValueError(
                f"trainer.min_lr={self.min_lr:g} exceeds trainer.lr={self.lr:g}: the schedule decays from lr down to "
                f"min_lr; set min_lr <= lr"
            )
        return self

    @property
    def model_parallel_size(self) -> int:
        """GPUs one model replica spans (TP x PP x CP); EP folds into data parallelism."""
        return self.tensor_parallel * self.pipeline_parallel * self.context_parallel
