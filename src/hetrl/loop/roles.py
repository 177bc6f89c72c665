"""Start-up shared by every role, then each rank's role main.

Start-up, after the handshake: trainer rank 0 makes sure an HF checkpoint of the initial policy
exists (``model.hf_checkpoint``, or a random-init one of the recipe's shape written into the run
directory: the same loading path either way), picks the weight-sync rendezvous, and broadcasts
both over the MPI world. Trainer rank 0 and every engine then join the weight-sync group
(trainer = group rank 0, engine i = group rank i + 1).
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from pathlib import Path

from hetrl.config.schema import HetrlConfig
from hetrl.control import liveness, rundir
from hetrl.control.comm import RoleContext
from hetrl.control.rendezvous import free_port
from hetrl.loop.faults import RankFaults
from hetrl.models.hf import build_random_hf_checkpoint

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobSetup:
    model_dir: str
    sync_host: str
    sync_port: int


def _initial_checkpoint(cfg: HetrlConfig, run_dir: Path) -> Path:
    if cfg.model.hf_checkpoint:
        return Path(cfg.model.hf_checkpoint)
    target = run_dir / rundir.INITIAL_MODEL
    if not (target / "config.json").exists():
        build_random_hf_checkpoint(cfg.model, target, seed=cfg.run.seed)
    return target


def job_setup(ctx: RoleContext, cfg: HetrlConfig, run_dir: Path) -> JobSetup:
    """Collective over the whole world: every rank gets trainer rank 0's setup."""
    root = ctx.plan.ranks_of("trainer")[0]
    setup = None
    if ctx.rank == root:
        setup = JobSetup(str(_initial_checkpoint(cfg, run_dir)), socket.gethostname(), free_port())
    return ctx.world.bcast(setup, root=root)


def weight_sync_endpoint(ctx: RoleContext, cfg: HetrlConfig, run_dir: Path, setup: JobSetup, sender: bool):
    """The sender (trainer rank 0) or a receiver (an engine) of the weight-sync group."""
    # lazy: torch, which only the trainer's and the engines' ranks load
    import torch

    from hetrl.transport.weights.collective import init_weight_sync_group
    from hetrl.transport.weights.factory import (
        build_weight_receiver,
        build_weight_sender,
        receive_device,
        resolve_transport,
        weight_sync_backend,
    )

    on_gpu = torch.cuda.is_available()
    sender_rank = ctx.plan.ranks_of("trainer")[0]
    kind = resolve_transport(
        cfg.rollout.weight_sync, on_gpu=on_gpu, engines_on_sender_gpu=ctx.plan.engines_share_gpu_of(sender_rank)
    )
    on_sender_gpu = [a.world_rank for a in ctx.plan.engines_on_gpu_of(sender_rank)]
    backend = weight_sync_backend(
        kind,
        on_gpu=on_gpu,
        engine_on_sender_gpu=bool(on_sender_gpu),
        engine_tensor_parallel=cfg.rollout.engine_tensor_parallel,
    )
    verify = cfg.rollout.verify_weight_sync
    if kind == "filesystem":
        root = run_dir / rundir.WEIGHTS
        if sender:
            return build_weight_sender(kind, root=root, verify=verify)
        return build_weight_receiver(kind, root=root, verify=verify, wait_s=cfg.rollout.weight_sync_timeout_s)
    engines = ctx.plan.ranks_of("rollout")
    group_rank = 0 if sender else engines.index(ctx.rank) + 1
    device = None if sender else receive_device(kind, backend, on_sender_gpu=ctx.rank in on_sender_gpu)
    group = init_weight_sync_group(
        setup.sync_host,
        setup.sync_port,
        group_rank,
        len(engines) + 1,
        backend=backend,
        device=device,
        timeout_s=cfg.rollout.weight_sync_timeout_s,
    )
    if sender:
        return build_weight_sender(kind, group=group, verify=verify)
    # An engine with TP workers stages pushes in /dev/shm, where they map them (see CollectiveWeightReceiver).
    return build_weight_receiver(kind, group=group, verify=verify, shared_memory=cfg.rollout.engine_tensor_parallel > 1)


def run_role(ctx: RoleContext, cfg: HetrlConfig, run_dir: Path, faults: RankFaults) -> None:
    """This rank's role, start to end. Each start-up phase reports itself to the liveness beacon,
    so the start timeout (``monitor.start_timeout_s``) bounds each phase, not the whole start; the
    role's first busy or idle report after them says the rank has started."""
    if ctx.rank == ctx.plan.ranks_of("trainer")[0]:
        liveness.starting("writing or finding the initial checkpoint")
    else:
        liveness.idle("job setup: waiting for trainer rank 0's initial checkpoint")
    setup = job_setup(ctx, cfg, run_dir)
    liveness.starting(f"starting the {ctx.role} role")
    if ctx.role == "orchestrator":
        from hetrl.loop.driver import run_orchestrator  # lazy: a rank loads its own role's stack only

        run_orchestrator(ctx, cfg, run_dir, Path(setup.model_dir))
    elif ctx.role == "reward":
        from hetrl.loop.reward_role import run_reward  # lazy: a rank loads its own role's stack only

        run_reward(ctx, cfg, faults)
    elif ctx.role == "reward_server":
        from hetrl.loop.reward_server_role import run_reward_server  # lazy: a rank loads its own role's stack only

        run_reward_server(ctx, cfg, Path(setup.model_dir), faults.countdown("server_crash"))
    elif ctx.role == "env":
        from hetrl.loop.env_role import run_env  # lazy: a rank loads its own role's stack only

        run_env(ctx, cfg, faults.countdown("env_crash"))
    elif ctx.role == "rollout":
        from hetrl.loop.rollout_role import run_rollout  # lazy: a rank loads its own role's stack only

        run_rollout(
            ctx,
            cfg,
            Path(setup.model_dir),
            weight_sync_endpoint(ctx, cfg, run_dir, setup, sender=False),
            faults.countdown("engine_crash"),
            faults.countdown("push_refused"),
        )
    elif ctx.role == "trainer":
        from hetrl.loop.trainer_role import run_trainer  # lazy: a rank loads its own role's stack only

        is_sender = ctx.rank == ctx.plan.ranks_of("trainer")[0]
        run_trainer(
            ctx,
            cfg,
            run_dir,
            Path(setup.model_dir),
            weight_sync_endpoint(ctx, cfg, run_dir, setup, sender=True) if is_sender else None,
            faults,
        )
    else:
        raise ValueError(f"unknown role {ctx.role!r}")
