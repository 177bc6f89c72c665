"""``run:``, ``schedule:``, ``eval:`` and ``checkpoint:`` — the RL loop around the roles."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from hetrl.config.base import Section


class RunConfig(Section):
    name: str = Field("hetrl", pattern=r"^[A-Za-z0-9._-]+$", description="Run name; the run directory is output_dir/name.")
    output_dir: str = Field("runs", description="Parent folder of run directories.")
    seed: int = Field(0, description="Seed of every random stream (tasks, sampling, init).")
    steps: int = Field(100, ge=1, description="Policy updates (RL steps) to train for.")
    prompts_per_step: int = Field(32, ge=1, description="Prompts per RL step (each sampled algorithm.group_size times).")
    threads_per_process: int | None = Field(None, ge=1, description="torch/OMP threads per role process; null = cores / local processes.")


class ScheduleConfig(Section):
    type: Literal["sync", "one_step_off", "async"] = Field(
        "sync", description="sync: on-policy; one_step_off: generate step k+1 while training step k; async: bounded staleness."
    )
    max_staleness: int = Field(1, ge=0, description="async: no sample older than this many policy versions is trained on.")
    stale_policy: Literal["drop", "regenerate"] = Field(
        "drop", description="A group older than the staleness bound (max_staleness; 0 for sync, where a refused weight "
        "push can make one stale): drop it and draw a new task (drop), or generate it again by the current policy under "
        "the same sample ids, task and seeds (regenerate). Either is counted (staleness/dropped, staleness/regenerated)."
    )

    @model_validator(mode="after")
    def _check(self) -> "ScheduleConfig":
        if self.type == "one_step_off" and self.max_staleness < 1:
            raise ValueError("schedule.type=one_step_off trains on samples one version old: schedule.max_staleness must be >= 1")
        return self


class EvalConfig(Section):
    every: int = Field(0, ge=0, description="Evaluate every N steps (0 = only before and after training).")
    num_tasks: int = Field(64, ge=1, description="Held-out tasks per evaluation.")
    k: int = Field(1, ge=1, description="Samples per task for mean@k / pass@k.")
    temperature: float = Field(0.0, ge=0.0, description="Eval sampling temperature (0 = greedy).")


class CheckpointConfig(Section):
    every: int = Field(0, ge=0, description="Save every N steps (0 = only at the end and on pre-emption).")
    resume: Literal["auto", "never"] = Field("auto", description="auto: resume from the run directory's latest checkpoint if there is one.")
    keep: int = Field(2, ge=1, description="Checkpoints kept (older ones deleted).")


class WarmStartConfig(Section):
    steps: int = Field(0, ge=0, description="Supervised steps on demonstrations before RL (0 = start RL from the initial weights).")
    batch_size: int = Field(64, ge=1, description="Demonstrations per warm-start step.")
    lr: float = Field(1e-3, gt=0.0, description="Learning rate of the warm start (a stage of its own: RL then starts with a fresh optimizer at trainer.lr).")
    template: str = Field("\\boxed{{{answer}}}", description="How a demonstration answers: a format string with {answer} (the task's reference answer).")
    seed_offset: int = Field(7919, description="Demonstration tasks come from the training source with seed run.seed + this (not the eval draw).")

    @field_validator("template")
    @classmethod
    def _formats_with_answer(cls, v: str) -> str:
        try:
            v.format(answer="")
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(f"warm_start.template={v!r} is not a format string over {{answer}} alone ({type(err).__name__}: {err}); "
                             "write a literal brace as {{ or }}") from None
        return v
