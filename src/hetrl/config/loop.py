"""``run:``, ``schedule:``, ``eval:`` and ``checkpoint:`` — the RL loop around the roles."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from hetrl.config.base import Section


class RunConfig(Section):
    name: str = Field(
        "hetrl", pattern=r"^[A-Za-z0-9._-]+$", description="Run name; the run directory is output_dir/name."
    )
    output_dir: str = Field("runs", description="Parent folder of run directories.")
    seed: int = Field(0, description="Seed of every random stream (tasks, sampling, init).")
    steps: int = Field(100, ge=1, description="Policy updates (RL steps) to train for.")
    prompts_per_step: int = Field(
        32, ge=1, description="Prompts per RL step (each sampled algorithm.group_size times)."
    )
    threads_per_process: int | None = Field(
        None, ge=1, description="torch/OMP threads per role process; null = cores / local processes."
    )


# The metrics an adaptive staleness bound can hold under its target (docs/metrics.md): the
# behaviour/trainer log-prob mismatch, or the share of tokens whose IS weight it pushed past
# algorithm.is_threshold. All three grow with the policy lag of the trained samples.
AdaptiveStalenessMetric = Literal["mismatch/k3_kl", "is/truncated_frac", "is/masked_frac"]


class AdaptiveStalenessConfig(Section):
    enabled: bool = Field(
        False,
        description="async: let the staleness bound float between min_staleness and schedule.max_staleness "
        "so that `metric` stays under `target` (the control rule: docs/architecture.md, Schedules and the staleness "
        "bound).",
    )
    metric: AdaptiveStalenessMetric = Field(
        "mismatch/k3_kl",
        description="The measured mismatch held under the target, read after each RL step: "
        "mismatch/k3_kl (any run), is/truncated_frac (algorithm.is_correction=truncated) or is/masked_frac "
        "(is_correction=masked or icepop).",
    )
    # ~10x the bf16 engine/trainer floor of mismatch/k3_kl (docs/metrics.md), a fifth of the
    # mismatch-spike guard's default ceiling.
    target: float = Field(
        0.01, gt=0.0, description="The metric's ceiling: a step above it halves the bound (down to min_staleness)."
    )
    min_staleness: int = Field(
        1, ge=0, description="The floor of the bound (0 = no overlap of generation and training, as sync)."
    )
    grow_below: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="Hysteresis: the bound grows by one only after `patience` steps in a row "
        "with the metric at most grow_below x target.",
    )
    patience: int = Field(
        3, ge=1, description="Consecutive calm steps (metric <= grow_below x target) before the bound grows by one."
    )


class ScheduleConfig(Section):
    type: Literal["sync", "one_step_off", "async"] = Field(
        "sync",
        description="sync: on-policy; one_step_off: generate step k+1 while training step k; async: bounded staleness.",
    )
    max_staleness: int = Field(
        1,
        ge=0,
        description="async: no sample older than this many policy versions is trained on (the ceiling of "
        "the bound with adaptive_staleness).",
    )
    stale_policy: Literal["drop", "regenerate"] = Field(
        "drop",
        description="A group older than the staleness bound (max_staleness; 0 for sync, where a refused weight "
        "push can make one stale): drop it and draw a new task (drop), or generate it again by the current policy "
        "under "
        "the same sample ids, task and seeds (regenerate). Either is counted (staleness/dropped, "
        "staleness/regenerated).",
    )
    adaptive_staleness: AdaptiveStalenessConfig = Field(
        default_factory=AdaptiveStalenessConfig, description="async: a staleness bound driven by a measured mismatch."
    )

    @model_validator(mode="after")
    def _check(self) -> ScheduleConfig:
        if self.type == "one_step_off" and self.max_staleness < 1:
            raise ValueError(
                "schedule.type=one_step_off trains on samples one version old: schedule.max_staleness must be >= 1"
            )
        adaptive = self.adaptive_staleness
        if adaptive.enabled and self.type != "async":
            raise ValueError(
                f"schedule.adaptive_staleness.enabled=true needs schedule.type=async (got {self.type!r}): "
                "only async has a bound to float; set schedule.type=async or "
                "adaptive_staleness.enabled=false"
            )
        if adaptive.enabled and adaptive.min_staleness >= self.max_staleness:
            raise ValueError(
                f"schedule.adaptive_staleness.min_staleness={adaptive.min_staleness} leaves the bound no "
                f"room below its ceiling schedule.max_staleness={self.max_staleness}: use min_staleness < "
                "max_staleness"
            )
        return self


class EvalConfig(Section):
    every: int = Field(0, ge=0, description="Evaluate every N steps (0 = only before and after training).")
    num_tasks: int = Field(64, ge=1, description="Held-out tasks per evaluation.")
    k: int = Field(1, ge=1, description="Samples per task for mean@k / pass@k.")
    temperature: float = Field(0.0, ge=0.0, description="Eval sampling temperature (0 = greedy).")
    image_ablation: bool = Field(
        False,
        description="env multimodal: after the final eval, score the policy again on the same tasks with every image "
        "moved to another task (does it look at the image?).",
    )
    allow_training_overlap: bool = Field(
        False,
        description="Accept eval tasks that training also sees. The held-out split (env.eval_tasks) carves the eval "
        "draw out of training by content; when it cannot (the draw is over a quarter of the training source's distinct "
        "tasks), launch.py and --dry-run refuse the recipe, unless this is true: then training keeps them and the run "
        "reports its eval as a training-set reward, not a held-out one.",
    )


class CheckpointConfig(Section):
    every: int = Field(0, ge=0, description="Save every N steps (0 = only at the end and on pre-emption).")
    resume: Literal["auto", "never"] = Field(
        "auto", description="auto: resume from the run directory's latest checkpoint if there is one."
    )
    keep: int = Field(2, ge=1, description="Checkpoints kept (older ones deleted).")


class WarmStartConfig(Section):
    steps: int = Field(
        0, ge=0, description="Supervised steps on demonstrations before RL (0 = start RL from the initial weights)."
    )
    batch_size: int = Field(64, ge=1, description="Demonstrations per warm-start step.")
    lr: float = Field(
        1e-3,
        gt=0.0,
        description="Learning rate of the warm start (a stage of its own: RL then starts with a fresh optimizer at "
        "trainer.lr).",
    )
    template: str = Field(
        "\\boxed{{{answer}}}",
        description="How a demonstration answers: a format string with {answer} (the task's reference answer).",
    )
    seed_offset: int = Field(
        7919,
        description="Demonstration tasks come from the training source with seed run.seed + this (not the eval draw).",
    )

    @field_validator("template")
    @classmethod
    def _formats_with_answer(cls, v: str) -> str:
        try:
            v.format(answer="")
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(
                f"warm_start.template={v!r} is not a format string over {{answer}} alone ({type(err).__name__}: "
                f"{err}); "
                "write a literal brace as {{ or }}"
            ) from None
        return v
