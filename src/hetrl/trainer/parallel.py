"""Trainer process groups (TP/PP/EP/CP/DP) from the recipe's ``trainer:`` section.

Ownership: every trainer rank calls :func:`init_parallel` once, after ``torch.distributed`` has a
world (or lets it create one from the ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``
environment that torchrun/srun provide). megatron-core keeps its groups in ``parallel_state``
module globals; we create them there (its modules still read some of them) and then hand the
groups around explicitly as a :class:`ParallelGroups` value, so the trainer code never reaches
for a global. The backend is NCCL on GPUs and gloo on CPU; on CPU the megatron compatibility
layer is applied first (see ``hetrl.trainer.megatron_compat``).

Rank order is megatron's ``tp-cp-ep-dp-pp``: tensor-parallel peers are adjacent ranks (one
node's NVLink domain), pipeline stages are the outermost split.
"""

from __future__ import annotations

import datetime
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hetrl.config.trainer import TrainerConfig
from hetrl.trainer import megatron_compat


@dataclass(frozen=True)
class ParallelGroups:
    """This rank's place in the trainer's parallel layout, and the groups to talk over."""

    world_size: int
    rank: int
    tp_size: int
    tp_rank: int
    pp_size: int
    pp_rank: int
    ep_size: int
    ep_rank: int
    cp_size: int
    cp_rank: int
    dp_size: int
    dp_rank: int
    device: torch.device
    pg_collection: object  # megatron.core.process_groups_config.ProcessGroupCollection

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def tp(self) -> dist.ProcessGroup:
        return self.pg_collection.tp

    @property
    def pp(self) -> dist.ProcessGroup:
        return self.pg_collection.pp

    @property
    def dp(self) -> dist.ProcessGroup:
        """Data-parallel group without context parallelism (batch sharding)."""
        return self.pg_collection.dp

    @property
    def dp_cp(self) -> dist.ProcessGroup:
        """Data x context parallel group: where gradients and token counts are reduced."""
        return self.pg_collection.dp_cp


def check_layout(cfg: TrainerConfig, world_size: int, *, has_gpu: bool) -> int:
    """Validate the layout against the world; returns the data-parallel size."""
    mp = cfg.model_parallel_size
    if world_size % mp:
        raise ValueError(
            f"trainer world size {world_size} is not divisible by tensor_parallel x pipeline_parallel x "
            f"context_parallel = {cfg.tensor_parallel} x {cfg.pipeline_parallel} x {cfg.context_parallel} = {mp}"
        )
    dp = world_size // mp
    # megatron folds EP into the data-parallel ranks of one (TP x CP) slice: EP must divide DP x CP.
    if (dp * cfg.context_parallel) % cfg.expert_parallel:
        raise ValueError(
            f"trainer.expert_parallel={cfg.expert_parallel} must divide data_parallel x context_parallel = "
            f"{dp} x {cfg.context_parallel} for world size {world_size}"
        )
    if not has_gpu and cfg.precision == "bf16" and not cpu_has_native_bf16():
        warnings.warn(
            "trainer.precision=bf16 on a CPU without native bf16 (AVX512-BF16 or AMX): its bf16 arithmetic is "
            "emulated, several times slower than fp32 (trainer.precision=fp32)",
            stacklevel=2,
        )
    return dp


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX tiles): there bf16 GEMMs run 2-3x
    faster than fp32 ones (measured on a Zen 4 EPYC: ~400 against ~180 GFLOP/s on 2 cores)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def _ensure_world(has_gpu: bool, timeout_minutes: int) -> None:
    if dist.is_initialized():
        return
    backend = "nccl" if has_gpu else "gloo"
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=timeout_minutes))


def init_parallel(cfg: TrainerConfig, *, timeout_minutes: int = 30) -> ParallelGroups:
    """Create the megatron process groups for ``cfg`` and return them as :class:`ParallelGroups`.

    Idempotent per process for the same layout; a different layout needs :func:`destroy_parallel`
    first.
    """
    from megatron.core import parallel_state as ps
    from megatron.core.process_groups_config import ProcessGroupCollection

    has_gpu = torch.cuda.is_available()
    megatron_compat.ensure_applied()
    _ensure_world(has_gpu, timeout_minutes)
    world_size, rank = dist.get_world_size(), dist.get_rank()
    dp = check_layout(cfg, world_size, has_gpu=has_gpu)
    if has_gpu:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(
            tensor_model_parallel_size=cfg.tensor_parallel,
            pipeline_model_parallel_size=cfg.pipeline_parallel,
            context_parallel_size=cfg.context_parallel,
            expert_model_parallel_size=cfg.expert_parallel,
            distributed_timeout_minutes=timeout_minutes,
            create_gloo_process_groups=has_gpu,  # on CPU the main groups already are gloo
        )
    elif (
        ps.get_tensor_model_parallel_world_size(),
        ps.get_pipeline_model_parallel_world_size(),
        ps.get_expert_model_parallel_world_size(),
    ) != (cfg.tensor_parallel, cfg.pipeline_parallel, cfg.expert_parallel):
        raise RuntimeError(
            "megatron parallel state is already initialised with another layout; call destroy_parallel() first"
        )
    return ParallelGroups(
        world_size=world_size,
        rank=rank,
        tp_size=cfg.tensor_parallel,
        tp_rank=ps.get_tensor_model_parallel_rank(),
        pp_size=cfg.pipeline_parallel,
        pp_rank=ps.get_pipeline_model_parallel_rank(),
        ep_size=cfg.expert_parallel,
        ep_rank=ps.get_expert_model_parallel_rank(),
        cp_size=cfg.context_parallel,
        cp_rank=ps.get_context_parallel_rank(),
        dp_size=dp,
        dp_rank=ps.get_data_parallel_rank(),
        device=torch.device("cuda", torch.cuda.current_device()) if has_gpu else torch.device("cpu"),
        pg_collection=ProcessGroupCollection.use_mpu_process_groups(),
    )


def destroy_parallel(*, destroy_world: bool = False) -> None:
    """Tear down megatron's groups (and the world when asked), e.g. between tests.

    megatron's ``destroy_model_parallel`` only forgets its groups; torch keeps them, each gloo group
    with its own threads and sockets. A process that builds one layout after another (the test
    rank pool) grew by ~15 groups and ~45 threads per layout until gloo slowed to a crawl, so the
    groups are destroyed here too.
    """
    from megatron.core import parallel_state as ps

    for group in _megatron_groups(ps):
        dist.destroy_process_group(group)
    ps.destroy_model_parallel()
    if destroy_world and dist.is_initialized():
        dist.destroy_process_group()


def _megatron_groups(parallel_state: Any) -> list[dist.ProcessGroup]:
    """Every process group held by megatron's ``parallel_state`` globals (singly, or in lists/dicts)."""
    found: dict[int, dist.ProcessGroup] = {}
    pending = [
        value for name, value in vars(parallel_state).items() if name.isupper()
    ]  # _TENSOR_MODEL_PARALLEL_GROUP, ...
    while pending:
        value = pending.pop()
        if isinstance(value, dist.ProcessGroup) and value is not dist.group.WORLD:
            found[id(value)] = value
        elif isinstance(value, (list, tuple)):
            pending.extend(value)
        elif isinstance(value, dict):
            pending.extend(value.values())
    return list(found.values())
