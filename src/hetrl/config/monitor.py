"""``monitor:`` — where metrics and rollouts go, and which alerts warn or stop the run.

JSONL metrics (``RUN/metrics.jsonl``) are always written: the plot and inspect tools read them.
Everything else is switchable here. Thresholds of the guards are in the units of the metric they
watch (see docs/metrics.md).
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

from pydantic import Field, model_validator

from hetrl.config.base import Section

GuardAction = Literal["warn", "stop"]


class WandbConfig(Section):
    enabled: bool = Field(
        False,
        description="Also log metrics to Weights & Biases (needs the `wandb` package; warns and skips if absent).",
    )
    project: str = Field("hetrl", description="W&B project name.")
    entity: str | None = Field(None, description="W&B entity (team or user); null uses the logged-in default.")
    name: str | None = Field(None, description="W&B run name; null uses the run directory's name.")
    mode: Literal["online", "offline"] = Field(
        "online",
        description="W&B mode; 'offline' writes to the run directory for a later `wandb sync` (compute nodes without "
        "internet).",
    )


class RolloutStoreConfig(Section):
    enabled: bool = Field(
        True,
        description="Append every rollout to HDF5 files under RUN/rollouts/ (browse with `python -m hetrl.browse "
        "RUN`).",
    )
    flush_every: int = Field(
        256,
        ge=1,
        description="Samples a trainer replica buffers in memory before it writes them and makes them visible to "
        "readers; each step's are written before the step is answered.",
    )
    compression: int = Field(
        1, ge=0, le=9, description="gzip level of the HDF5 datasets (0 = none); 1 is fast and shrinks token ids ~3x."
    )


class NonFiniteLossGuard(Section):
    enabled: bool = Field(True, description="Alert when any loss/* metric or grad_norm is NaN or infinite.")
    action: GuardAction = Field(
        "stop", description="What the alert does: 'warn' logs it, 'stop' ends the run after the step is logged."
    )


class RewardCollapseGuard(Section):
    enabled: bool = Field(
        True, description="Alert when the windowed mean reward falls far below its best value so far."
    )
    action: GuardAction = Field(
        "warn", description="What the alert does: 'warn' logs it, 'stop' ends the run after the step is logged."
    )
    window: int = Field(10, ge=1, description="Steps in the moving average of reward/mean.")
    max_drop: float = Field(
        0.5, gt=0.0, description="Alert when the moving average is this far (in reward units) below its best."
    )


class EntropyCollapseGuard(Section):
    enabled: bool = Field(
        True, description="Alert when the policy entropy stays below a floor (the policy turned deterministic)."
    )
    action: GuardAction = Field(
        "warn", description="What the alert does: 'warn' logs it, 'stop' ends the run after the step is logged."
    )
    min_entropy: float = Field(0.01, ge=0.0, description="Entropy floor in nats per token.")
    patience: int = Field(5, ge=1, description="Consecutive steps below the floor before alerting.")


class MismatchSpikeGuard(Section):
    enabled: bool = Field(True, description="Alert when the train/inference mismatch (mismatch/k3_kl) spikes.")
    action: GuardAction = Field(
        "warn", description="What the alert does: 'warn' logs it, 'stop' ends the run after the step is logged."
    )
    max_k3_kl: float = Field(0.05, gt=0.0, description="Absolute ceiling of mismatch/k3_kl in nats per token.")
    spike_factor: float | None = Field(
        10.0,
        gt=1.0,
        description="Also alert when mismatch/k3_kl exceeds this multiple of its median over the previous `window` "
        "steps; null disables.",
    )
    window: int = Field(20, ge=2, description="Steps in the running median the spike factor compares against.")


class GuardsConfig(Section):
    nonfinite_loss: NonFiniteLossGuard = Field(
        default_factory=NonFiniteLossGuard, description="NaN/inf loss or gradient norm."
    )
    reward_collapse: RewardCollapseGuard = Field(
        default_factory=RewardCollapseGuard, description="Reward falling far below its best."
    )
    entropy_collapse: EntropyCollapseGuard = Field(
        default_factory=EntropyCollapseGuard, description="Entropy under a floor."
    )
    mismatch_spike: MismatchSpikeGuard = Field(
        default_factory=MismatchSpikeGuard, description="Engine vs trainer log-prob drift."
    )

    @model_validator(mode="before")
    @classmethod
    def _drop_stalled_role(cls, data: Any) -> Any:
        """``stalled_role`` was replaced by the liveness watchdog (``monitor.hang_timeout_s``). Run
        directories written before still carry it in their config.yaml, and must still resume."""
        if isinstance(data, dict) and "stalled_role" in data:
            warnings.warn(
                "monitor.guards.stalled_role is gone: hangs are the liveness watchdog's (monitor.hang_timeout_s, "
                "docs/hangs.md); the key is ignored",
                DeprecationWarning,
                stacklevel=2,
            )
            data = {key: value for key, value in data.items() if key != "stalled_role"}
        return data


class MonitorConfig(Section):
    console: bool = Field(
        True, description="Show progress on the console: a live rich view on a TTY, one plain line per step otherwise."
    )
    verbose: bool = Field(
        False,
        description="Print every role's library output (vLLM, megatron, torch, C++ warnings) on the console along with "
        "hetrl's own lines; by default it goes to that rank's log, RUN/logs/<role>_<rank>.log, instead.",
    )
    timeline: bool = Field(
        True,
        description="Record every rank's phases of work and every control message's latency into RUN/timeline/ "
        "(hetrl.control.timeline); python -m hetrl.plot RUN draws them as a Gantt chart of a few steps.",
    )
    console_metrics: list[str] = Field(
        default_factory=lambda: [
            "reward/mean",
            "response_length/mean",
            "entropy",
            "approx_kl",
            "mismatch/k3_kl",
            "grad_norm",
            "staleness/mean",
            "time/step",
        ],
        description="Metrics shown in the console table / log line, in order (documented names, see docs/metrics.md).",
    )
    tensorboard: bool = Field(True, description="Write TensorBoard event files under RUN/tensorboard/.")
    wandb: WandbConfig = Field(default_factory=WandbConfig, description="Weights & Biases logging.")
    rollout_store: RolloutStoreConfig = Field(
        default_factory=RolloutStoreConfig, description="HDF5 store of every rollout."
    )
    guards: GuardsConfig = Field(
        default_factory=GuardsConfig, description="Alerts that warn about or stop a run going wrong."
    )
    hang_timeout_s: float = Field(
        1800.0,
        ge=10.0,
        description="Liveness watchdog: a rank holding work that makes no progress for this long, or that stops "
        "answering, ends the job "
        "with its stacks in RUN/hang/ (under Slurm the job is requeued and resumes). Must exceed the longest single "
        "phase "
        "(engine start, one optimizer step, a checkpoint save, a weight push).",
    )
    start_timeout_s: float = Field(
        3600.0,
        ge=10.0,
        description="Liveness watchdog, while a rank starts (builds its model, starts its engine, writes the initial "
        "checkpoint): a start-up phase that makes no progress for this long, or a rank that does not start answering "
        "within it, ends the job like a hang (docs/hangs.md). Until every rank has started, no rank's wait counts "
        "against monitor.hang_timeout_s. At least monitor.hang_timeout_s.",
    )
    hang_restarts: int = Field(
        2,
        ge=0,
        description="Under Slurm: requeues after hangs in a row (with no newer checkpoint between them), at most; a "
        "hang that keeps coming back is deterministic and is not requeued again.",
    )

    @model_validator(mode="after")
    def _check_start_timeout(self) -> MonitorConfig:
        """A start is bounded more loosely than the work after it, never more tightly: a phase the hang
        timeout allows would otherwise end the job only because it came first."""
        if self.start_timeout_s < self.hang_timeout_s:
            raise ValueError(
                f"monitor.start_timeout_s={self.start_timeout_s:g} must be at least monitor.hang_timeout_s="
                f"{self.hang_timeout_s:g}: raise monitor.start_timeout_s"
            )
        return self
