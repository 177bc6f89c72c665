"""Checkpoints: exact resume, crash safety of ``latest``, keep-last-K, TP=2 -> TP=1 / PP=2 resharding.

The multi-rank part runs as one job on the session's two gloo ranks, because every
``dist_checkpointing`` save costs ~7-10 s here: a PolicyTrainer (TP=2) trains 3 steps, saves, trains
one more, has its step-4 save "crash" after all shards were written but before it was published,
and trains a fifth step; a fresh trainer with another seed then resumes from the root (which must
name step 3) and trains steps 4 and 5. The filesystem protocol is also tested directly, in-process.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from rank_pool import may_start_processes
from samples import make_samples

from hetrl.config.algorithm import AlgorithmConfig
from hetrl.config.model import ModelConfig
from hetrl.config.trainer import TrainerConfig
from hetrl.trainer import checkpoint

MODEL = ModelConfig(arch="qwen3", hidden_size=64, num_layers=2, ffn_hidden_size=96, vocab_size=127)
ALGO = AlgorithmConfig(name="grpo", group_size=2)
# Warmup then linear decay: a resume that lost the schedule's position would use other LRs.
TRAINER = dict(precision="fp32", lr=1e-3, lr_warmup_steps=2, lr_decay_style="linear", micro_batch_size=2)
TOTAL_STEPS = 8


class SimulatedCrash(RuntimeError):
    pass


def _trainer(tcfg: TrainerConfig, seed: int):
    from hetrl.trainer.policy import PolicyTrainer

    return PolicyTrainer(MODEL, tcfg, ALGO, seed=seed, total_steps=TOTAL_STEPS, max_len=16)


def _batch(trainer):
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.3, -0.3])
    return trainer.make_batch(make_samples(8, vocab=MODEL.vocab_size)).with_advantages(advantages)


def _params(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.module.named_parameters()}


def _adam_moments(trainer) -> dict[str, dict[str, torch.Tensor]]:
    """``{"exp_avg": {param name: tensor}, "exp_avg_sq": {...}}`` of the policy's optimizer."""
    names = {p: n for n, p in trainer.module.named_parameters()}
    moments: dict[str, dict[str, torch.Tensor]] = {"exp_avg": {}, "exp_avg_sq": {}}
    for opt in getattr(trainer.optimizer, "chained_optimizers", [trainer.optimizer]):
        for param, state in opt.optimizer.state.items():
            for key, by_name in moments.items():
                by_name[names[param]] = state[key].detach().clone()
    return moments


def _random_draws() -> tuple:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def _crashing_save(real_save):
    def save(*args, **kwargs):
        real_save(*args, **kwargs)  # every shard is on disk...
        raise SimulatedCrash("killed before publishing")  # ...and the process dies here

    return save


def _resume_job(rank: int, world_size: int, root: Path) -> dict:
    """Save at 3 / crash at 4 / train to 5, then resume from the root and train to 5 again."""
    from megatron.core import dist_checkpointing

    from hetrl.trainer.parallel import destroy_parallel

    tcfg = TrainerConfig(tensor_parallel=2, **TRAINER)
    out: dict = {}
    trainer = _trainer(tcfg, seed=11)
    try:
        batch = _batch(trainer)
        for _ in range(3):
            trainer.train_step(batch)
        with may_start_processes():
            checkpoint.start_checkpoint_writer()
            # Slurm's pre-emption SIGTERM reaches every process of the job: the writer's helper must
            # survive it, or the checkpoint the signal asks for fails.
            helpers = multiprocessing.active_children()
            for helper in helpers:
                os.kill(helper.pid, signal.SIGTERM)
            out["helpers_signalled"] = len(helpers)
            checkpoint.save_checkpoint(
                root,
                trainer.step,
                trainer.model,
                trainer.optimizer,
                trainer.scheduler,
                extra={"cursor": {"epoch": 1, "index": 24}},
                keep=2,
            )
        out["draws_after_save"] = _random_draws()
        out["params_at_3"] = _params(trainer)
        out["moments_at_3"] = _adam_moments(trainer)
        trainer.train_step(batch)
        real_save = dist_checkpointing.save
        dist_checkpointing.save = _crashing_save(real_save)
        try:
            with may_start_processes():
                checkpoint.save_checkpoint(root, trainer.step, trainer.model, trainer.optimizer, trainer.scheduler)
        except SimulatedCrash:
            out["crashed"] = True
        finally:
            dist_checkpointing.save = real_save
        out["listing_after_crash"] = sorted(p.name for p in root.iterdir())
        trainer.train_step(batch)
        out["straight"] = _params(trainer)
    finally:
        destroy_parallel()

    resumed = _trainer(tcfg, seed=99)  # other init: everything must come from the checkpoint
    try:
        state = checkpoint.load_checkpoint(root, resumed.model, resumed.optimizer, resumed.scheduler)
        out["draws_after_load"] = _random_draws()
        resumed.step = state.step
        out["state"] = (state.step, state.extra, state.rng_restored, state.path.name)
        batch = _batch(resumed)
        out["lrs"] = [resumed.train_step(batch)["lr"] for _ in range(2)]
        out["resumed"] = _params(resumed)
    finally:
        destroy_parallel()
    return out


def _reshard_job(rank: int, world_size: int, root: Path, layout: dict) -> dict:
    """Load the TP=2 step-3 checkpoint into another layout: weights, Adam moments, LRs."""
    from hetrl.trainer.parallel import destroy_parallel

    trainer = _trainer(TrainerConfig(**layout, **TRAINER), seed=5)
    try:
        with pytest.warns(UserWarning, match="RNG states not restored"):
            state = checkpoint.load_checkpoint(
                root / "step_00000003", trainer.model, trainer.optimizer, trainer.scheduler
            )
        trainer.step = state.step
        out = {
            "step": state.step,
            "rng_restored": state.rng_restored,
            "params": _params(trainer),
            **_adam_moments(trainer),
        }
        batch = _batch(trainer)
        out["lrs"] = [trainer.train_step(batch)["lr"] for _ in range(2)]
        return out
    finally:
        destroy_parallel()


def _as_hf(rank: int, world_size: int, layout: dict, per_rank: list[dict]) -> dict:
    """Per-rank parameter-shaped tensors (weights or Adam moments) as full HF tensors."""
    from hetrl.trainer.exporter import iter_hf_tensors
    from hetrl.trainer.model import build_gpt_model
    from hetrl.trainer.parallel import destroy_parallel, init_parallel

    tcfg = TrainerConfig(**layout, **TRAINER)
    groups = init_parallel(tcfg)
    try:
        model = build_gpt_model(MODEL, tcfg, pg_collection=groups.pg_collection)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(per_rank[rank][name])
        return dict(iter_hf_tensors(model, MODEL.vocab_size, pg_collection=groups.pg_collection))
    finally:
        destroy_parallel()


@pytest.fixture(scope="module")
def resumed(two_ranks, tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return root, two_ranks.run(_resume_job, root)


def test_resume_reproduces_training_exactly(resumed) -> None:
    _, ranks = resumed
    for out in ranks:
        assert out["helpers_signalled"] >= 1
        assert out["state"] == (3, {"cursor": {"epoch": 1, "index": 24}}, True, "step_00000003")
        assert out["draws_after_load"] == out["draws_after_save"]  # python, numpy and torch RNG
        assert out["lrs"][0] != out["lrs"][1]  # the schedule moves, so its state mattered
        assert out["straight"].keys() == out["resumed"].keys()
        for name, tensor in out["straight"].items():
            assert torch.equal(out["resumed"][name], tensor), name
        changed = any(not torch.equal(out["params_at_3"][n], t) for n, t in out["straight"].items())
        assert changed


def test_crash_mid_save_leaves_latest_at_the_previous_checkpoint(resumed) -> None:
    root, ranks = resumed
    assert ranks[0]["crashed"] and ranks[1]["crashed"]
    assert ranks[0]["listing_after_crash"] == ["latest", "step_00000003", "step_00000004.tmp"]
    assert checkpoint.latest_checkpoint(root) == root / "step_00000003"


@pytest.mark.parametrize(
    "layout", [{}, {"pipeline_parallel": 2}, {"context_parallel": 2}], ids=["tp1_dp2", "pp2", "cp2"]
)
def test_tp2_checkpoint_loads_into_another_layout(two_ranks, resumed, layout: dict) -> None:
    """Weights and Adam moments come back bit-exact in the other layout, and the LR schedule goes on."""
    root, ranks = resumed
    loaded = two_ranks.run(_reshard_job, root, layout)
    assert all(r["step"] == 3 and not r["rng_restored"] for r in loaded)
    assert loaded[0]["lrs"] == ranks[0]["lrs"]
    for kind in ("params", "exp_avg", "exp_avg_sq"):
        saved = [r["params_at_3"] if kind == "params" else r["moments_at_3"][kind] for r in ranks]
        expected = two_ranks.run(_as_hf, {"tensor_parallel": 2}, saved)[0]
        got = two_ranks.run(_as_hf, layout, [r[kind] for r in loaded])[0]
        assert got.keys() == expected.keys()
        for name, tensor in expected.items():
            assert torch.equal(got[name], tensor), f"{kind} {name}"
        assert any(t.abs().sum() > 0 for t in got.values()), kind


# --- the filesystem protocol, without megatron ---------------------------------------------------


def _fake_save(root: Path, step: int) -> Path:
    tmp = root / (checkpoint.step_dir_name(step) + ".tmp")
    tmp.mkdir(parents=True)
    (tmp / "shard").write_bytes(os.urandom(64))
    checkpoint.publish(tmp, root / checkpoint.step_dir_name(step))
    return root / checkpoint.step_dir_name(step)


def test_publish_moves_latest_and_cleanup_keeps_the_newest(tmp_path: Path) -> None:
    assert checkpoint.latest_checkpoint(tmp_path) is None
    for step in (1, 2, 3):
        assert checkpoint.latest_checkpoint(_fake_save(tmp_path, step).parent) == tmp_path / checkpoint.step_dir_name(
            step
        )
    (tmp_path / "step_00000004.tmp").mkdir()  # a crashed save
    checkpoint.remove_stale(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000002", "step_00000003"]


def test_failed_rename_keeps_latest(tmp_path: Path, monkeypatch) -> None:
    _fake_save(tmp_path, 1)
    tmp = tmp_path / "step_00000002.tmp"
    tmp.mkdir()

    def failing_rename(*args):
        raise OSError("disk gone")

    monkeypatch.setattr(checkpoint.os, "rename", failing_rename)
    with pytest.raises(OSError):
        checkpoint.publish(tmp, tmp_path / "step_00000002")
    assert checkpoint.latest_checkpoint(tmp_path) == tmp_path / "step_00000001"
    assert not (tmp_path / "latest.tmp").exists()


def test_cleanup_never_removes_what_latest_names(tmp_path: Path) -> None:
    """A run restarted from an older checkpoint keeps it even when newer (abandoned) ones exist."""
    for step in (5, 6, 7):
        _fake_save(tmp_path, step)
    checkpoint._write_pointer(tmp_path, "step_00000005")
    checkpoint.remove_stale(tmp_path, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000005", "step_00000007"]


# --- bf16 (megatron's mixed precision) on CPU ----------------------------------------------------


def _bf16_job(rank: int, world_size: int, root: Path) -> dict:
    """bf16 trains (fp32 master weights in the optimizer), saves at step 2, trains a third step; a fresh
    trainer resumes from the checkpoint and trains the third step again."""
    from hetrl.trainer.parallel import destroy_parallel

    tcfg = TrainerConfig(**{**TRAINER, "precision": "bf16"})
    out: dict = {}
    trainer = _trainer(tcfg, seed=11)
    try:
        out["dtypes"] = {p.dtype for p in trainer.module.parameters()}
        out["master_dtypes"] = {p.main_param.dtype for p in trainer.module.parameters()}
        out["fused"] = _fused_flags(trainer.optimizer)
        batch = _batch(trainer)
        out["initial"] = _params(trainer)
        out["grad_norms"] = [trainer.train_step(batch)["grad_norm"] for _ in range(2)]
        with may_start_processes():
            checkpoint.start_checkpoint_writer()
            _set_fused(trainer.optimizer, None)  # saved as hetrl saved it before it took the fused kernel
            checkpoint.save_checkpoint(root, trainer.step, trainer.model, trainer.optimizer, trainer.scheduler)
            _set_fused(trainer.optimizer, True)
        trainer.train_step(batch)
        out["straight"] = _params(trainer)
    finally:
        destroy_parallel()
    resumed = _trainer(tcfg, seed=99)
    try:
        resumed.step = checkpoint.load_checkpoint(root, resumed.model, resumed.optimizer, resumed.scheduler).step
        out["fused_after_load"] = _fused_flags(resumed.optimizer)
        resumed.train_step(_batch(resumed))
        out["resumed"] = _params(resumed)
    finally:
        destroy_parallel()
    return out


def _adam_groups(optimizer) -> list[dict]:
    """The param groups of the torch Adam inside megatron's optimizer."""
    return [
        group for part in getattr(optimizer, "chained_optimizers", [optimizer]) for group in part.optimizer.param_groups
    ]


def _fused_flags(optimizer) -> set[tuple]:
    return {(group["fused"], group["foreach"]) for group in _adam_groups(optimizer)}


def _set_fused(optimizer, fused: bool | None) -> None:
    for group in _adam_groups(optimizer):
        group.update(fused=fused, foreach=False if fused else None)


def test_bf16_trains_with_fp32_master_weights_and_resumes_exactly(two_ranks, tmp_path: Path) -> None:
    """trainer.precision=bf16 on CPU: every parameter (hetrl's norms too) is bf16 and the optimizer keeps fp32
    master weights (megatron's Float16 optimizer, whose CUDA type checks the compatibility layer answers).
    Its torch Adam steps with the fused kernel, also after loading a checkpoint saved without it."""
    for out in two_ranks.run(_bf16_job, tmp_path):
        assert out["dtypes"] == {torch.bfloat16} and out["master_dtypes"] == {torch.float32}
        assert out["fused"] == out["fused_after_load"] == {(True, False)}
        assert all(np.isfinite(g) and g > 0 for g in out["grad_norms"])
        assert any(not torch.equal(out["initial"][n], t) for n, t in out["straight"].items())
        for name, tensor in out["straight"].items():
            assert torch.equal(out["resumed"][name], tensor), name
