"""The whole recipe as one typed tree: every key a recipe or a ``key=value`` override may set.

Importable without torch, so a login node validates a recipe before anything is submitted.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from hetrl.config.algorithm import AlgorithmConfig
from hetrl.config.base import Section
from hetrl.config.cluster import ClusterConfig
from hetrl.config.critic import CriticConfig
from hetrl.config.env import EnvConfig
from hetrl.config.loop import CheckpointConfig, EvalConfig, RunConfig, ScheduleConfig, WarmStartConfig
from hetrl.config.model import ModelConfig
from hetrl.config.monitor import MonitorConfig
from hetrl.config.reward import RewardConfig
from hetrl.config.rollout import RolloutConfig
from hetrl.config.trainer import TrainerConfig


class HetrlConfig(Section):
    recipe: str = Field("custom", description="Name of the recipe this config was composed from (informational).")
    nodes: int = Field(1, ge=1, description="GPU-partition nodes for trainer + engines (CPU-only: the number of local 'nodes', 1).")
    run: RunConfig = Field(default_factory=RunConfig, description="Run identity, seed and length.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy architecture and weights.")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="RL objective.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Trainer parallelism and optimisation.")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="PPO's value model (algorithm.name=ppo).")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Generation engines.")
    env: EnvConfig = Field(default_factory=EnvConfig, description="Environment and tasks.")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Rewards and sandbox.")
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig, description="Sync/async schedule.")
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig, description="Supervised warm start on demonstrations.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpointing and resume.")
    monitor: MonitorConfig = Field(default_factory=MonitorConfig, description="Metrics, console, rollout store, guards.")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="Cluster profile.")

    @model_validator(mode="after")
    def _check_cross_section(self) -> "HetrlConfig":
        if self.cluster.gpus_per_node == 0 and self.trainer.precision != "fp32":
            raise ValueError(f"trainer.precision={self.trainer.precision!r} on a CPU-only cluster profile (cluster.gpus_per_node=0): use trainer.precision=fp32")
        if self.trainer.expert_parallel > 1 and not self.model.is_moe:
            raise ValueError(f"trainer.expert_parallel={self.trainer.expert_parallel} needs an MoE model (model.arch=qwen3_moe)")
        return self
