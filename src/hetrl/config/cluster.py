"""``cluster:`` — the machines: GPUs per node, partitions and Slurm accounting fields."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hetrl.config.base import Section


class ClusterConfig(Section):
    name: str = Field("local", description="Profile name (shown in the plan).")
    launcher: Literal["local", "slurm"] = Field(
        "local", description="local: mpiexec on this machine; slurm: a heterogeneous Slurm job."
    )
    gpus_per_node: int = Field(0, ge=0, description="GPUs per GPU node (0 = CPU-only, the embedded default).")
    cpus_per_node: int = Field(2, ge=1, description="CPU cores per node.")
    mem_per_node_gb: int | None = Field(None, ge=1, description="Memory to request per node; null = Slurm default.")
    gpu_partition: str = Field("gpu", description="Partition of trainer and engine nodes.")
    cpu_partition: str = Field(
        "cpu", description="Partition of reward/verifier/sandbox workers (and env servers, env.placement=role)."
    )
    cpu_nodes: int = Field(
        1, ge=0, description="Nodes on the CPU partition for reward/sandbox workers and env servers."
    )
    reward_workers_per_node: int = Field(1, ge=1, description="Reward worker processes per CPU node.")
    env_workers_per_node: int = Field(
        1,
        ge=1,
        description="Env-server ranks per CPU node when env.placement=role (each runs many episodes at once); "
        "unused when environments run inline.",
    )
    time_limit: str = Field(
        "04:00:00", pattern=r"^(\d+-)?\d{1,2}:\d{2}:\d{2}$", description="Slurm time limit, [D-]HH:MM:SS."
    )
    account: str | None = Field(None, description="Slurm account (--account).")
    qos: str | None = Field(None, description="Slurm QoS (--qos).")
    constraint: str | None = Field(None, description="Slurm node constraint (--constraint).")
    reservation: str | None = Field(None, description="Slurm reservation (--reservation).")
    requeue: bool = Field(
        True, description="Let Slurm requeue the job after pre-emption (the loop checkpoints on the signal)."
    )
    signal_grace_s: int = Field(120, ge=10, description="Seconds before the time limit Slurm sends SIGUSR1 (--signal).")
    container: str | None = Field(
        None,
        description="Apptainer image (.sif) to run every component in (`apptainer exec --nv`); null runs on the host.",
    )
    container_binds: list[str] = Field(
        default_factory=list,
        description="Extra host paths bound into the container, apptainer `src[:dst[:opts]]` each (the run dir is "
        "always bound).",
    )
