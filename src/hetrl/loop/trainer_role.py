"""The trainer role: every trainer rank takes the step's full batch, trains its DP shard, and rank 0
streams the new weights to the engines.

Ownership: the policy's weights live here. After each optimizer step, trainer rank 0 reports the
new version to the orchestrator and then pushes the weights in HF layout, bucket by bucket, from the
streaming exporter (every trainer rank takes part in the exporter's gathers); the engines join the
push when the orchestrator tells them to. Warm-start (``supervised``) steps use plain token-mean
likelihood: no ratio, no clipping, no IS correction.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hetrl.config.schema import HetrlConfig
from hetrl.control.comm import RoleContext, Tag, recv, send
from hetrl.loop.work import Shutdown, TrainDone, TrainWork

logger = logging.getLogger(__name__)


def _supervised_algorithm(cfg: HetrlConfig):
    """GRPO's loss at ratio 1 with advantage 1 is exactly the token-mean NLL gradient."""
    return cfg.algorithm.model_copy(update={"name": "grpo", "is_correction": "none", "kl_coef": 0.0, "entropy_coef": 0.0,
                                            "loss_aggregation": "token-mean"})


def init_trainer_world(ctx: RoleContext) -> None:
    """torch.distributed over the trainer ranks only (Megatron's default group), rendezvous via MPI."""
    import socket

    import torch
    import torch.distributed as dist

    from hetrl.loop.roles import free_port

    address = (socket.gethostname(), free_port()) if ctx.role_comm.Get_rank() == 0 else None
    host, port = ctx.role_comm.bcast(address, root=0)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=ctx.role_comm.Get_rank(), world_size=ctx.role_comm.Get_size())


def run_trainer(ctx: RoleContext, cfg: HetrlConfig, run_dir: Path, model_dir: Path, sender: Any | None) -> None:
    import torch

    from hetrl.trainer.exporter import iter_hf_weight_buckets
    from hetrl.trainer.hf_convert import load_hf_checkpoint
    from hetrl.trainer.policy import PolicyTrainer

    init_trainer_world(ctx)
    torch.manual_seed(cfg.run.seed)
    total_steps = cfg.run.steps + cfg.warm_start.steps
    trainer = PolicyTrainer(cfg.model, cfg.trainer, cfg.algorithm, seed=cfg.run.seed, total_steps=total_steps,
                            temperature=cfg.rollout.temperature, max_len=cfg.rollout.max_tokens)
    load_hf_checkpoint(trainer.module, model_dir, trainer.groups.pg_collection)
    if trainer.reference is not None:
        trainer.sync_reference()
    rl_algorithm, sft_algorithm = trainer.algo_cfg, _supervised_algorithm(cfg)
    version = 0
    bucket_bytes = cfg.rollout.weight_sync_bucket_mb << 20
    while True:
        message, _, _ = recv(ctx.world, ctx.orchestrator_rank, Tag.WORK)
        if isinstance(message, Shutdown):
            return
        if not isinstance(message, TrainWork):
            raise TypeError(f"trainer got an unexpected {type(message).__name__}")
        trainer.algo_cfg = sft_algorithm if message.supervised else rl_algorithm
        batch = trainer.make_batch(message.samples, _padded(message.advantages))
        metrics = trainer.train_step(batch)
        version += 1
        buckets = iter_hf_weight_buckets(trainer.module, cfg.model.vocab_size, bucket_bytes=bucket_bytes)
        if sender is None:
            for _ in buckets:  # non-zero ranks only contribute their shards to the gathers
                pass
            continue
        send(ctx.world, TrainDone(message.step, version, metrics), ctx.orchestrator_rank, Tag.RESULT)
        sender.send(buckets, version)


def _padded(advantages: list[list[float]]):
    import torch

    width = max((len(a) for a in advantages), default=1) or 1
    out = torch.zeros(len(advantages), width)
    for row, values in enumerate(advantages):
        out[row, : len(values)] = torch.tensor(values, dtype=torch.float32)
    return out
