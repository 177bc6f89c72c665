"""Run under ``mpiexec -n 3``: the trainer role's data plane with two data-parallel replicas.

World rank 0 plays the orchestrator and the engines; ranks 1 and 2 are the trainer (a tiny llama, gloo, DP=2),
serving as :class:`hetrl.loop.trainer_role.TrainerRank` does in a run (its weight push goes to a stand-in that
only drives the exporter's gathers). Rank 0 waits for the leader's :class:`TrainerLayout`, deals each step as the
orchestrator does (``trainer.shards.step_shard`` on the layout), sends each replica's receiver its own samples
only, in two :class:`TrainShard` parts (two holders would), then the :class:`TrainWork` header to the leader: a
warm-start step, then an RL step. It writes the layout and each step's :class:`TrainDone` metrics as JSON to
``OUT/result.json``; the trainer ranks write their rollout store parts under ``OUT/rollouts``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

from mpi4py import MPI
from samples import make_step

from hetrl.config.loader import load_config
from hetrl.control.comm import Tag, flush_sends, recv, send
from hetrl.control.protocol import Shutdown, TrainerLayout, TrainShard, TrainWork
from hetrl.loop.faults import RankFaults
from hetrl.records import SampleMeta
from hetrl.trainer.shards import step_shard

OVERRIDES = ["algorithm.group_size=2", "trainer.updates_per_batch=1", "monitor.rollout_store.flush_every=4"]
NUM_SAMPLES = 12
STEPS = ((-1, True), (0, False))  # (step, supervised): a warm-start step, then an RL step
TIMEOUT_S = 300.0


def step_samples(step: int, vocab: int) -> list:
    """The samples of ``step`` (the test regenerates them)."""
    return make_step(NUM_SAMPLES, vocab=vocab, seed=step + 1)


def orchestrate(world, cfg, out: Path) -> None:
    layout, _, _ = recv(world, 1, Tag.RESULT, timeout_s=TIMEOUT_S)
    assert isinstance(layout, TrainerLayout), layout
    done = []
    for step, supervised in STEPS:
        samples = step_samples(step, cfg.model.vocab_size)
        metas = [SampleMeta.of(s) for s in samples]
        dp_size = len(layout.receivers)
        for dp_rank, receiver in enumerate(layout.receivers):
            indices = step_shard(metas, 1, dp_rank, dp_size, layout.tokens_per_image, layout.shared_prompts)
            half = len(indices) // 2
            for part in (indices[:half], indices[half:]):
                send(world, TrainShard(step, [samples[i] for i in part]), receiver, Tag.SHARD)
        send(world, TrainWork.of(step, metas, supervised), 1, Tag.WORK)
        done.append(recv(world, 1, Tag.RESULT, timeout_s=TIMEOUT_S)[0].metrics)
    send(world, Shutdown(), 1, Tag.WORK)
    flush_sends()
    (out / "result.json").write_text(json.dumps({"layout": asdict(layout), "done": done}))


class _Sender:
    """The weight push's stand-in: it draws the buckets (every trainer rank takes part in their gathers)."""

    def send(self, buckets, version: int, attempt: int) -> None:
        for _ in buckets:
            pass


def train(world, role_comm, cfg, out: Path) -> None:
    import torch

    from hetrl.loop.trainer_role import TrainerRank, init_trainer_world
    from hetrl.trainer.parallel import destroy_parallel
    from hetrl.trainer.policy import PolicyTrainer

    role_rank = role_comm.Get_rank()
    ctx = SimpleNamespace(
        world=world,
        role_comm=role_comm,
        rank=world.Get_rank(),
        orchestrator_rank=0,
        role="trainer",
        assignment=SimpleNamespace(role_rank=role_rank),
    )
    torch.set_num_threads(1)
    init_trainer_world(ctx)
    trainer = PolicyTrainer(cfg.model, cfg.trainer, cfg.algorithm, seed=0, total_steps=4, max_len=16)
    sender = _Sender() if role_rank == 0 else None
    try:
        TrainerRank(ctx, cfg, out, trainer, None, sender, RankFaults([], "trainer", role_rank)).serve()
    finally:
        destroy_parallel()
        flush_sends()


def main(out: Path) -> None:
    world = MPI.COMM_WORLD
    role_comm = world.Split(color=int(world.Get_rank() > 0), key=world.Get_rank())
    cfg = load_config("tiny_grpo", OVERRIDES)
    if world.Get_rank() == 0:
        orchestrate(world, cfg, out)
    else:
        train(world, role_comm, cfg, out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
