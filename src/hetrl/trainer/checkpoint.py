"""Training checkpoints: megatron ``dist_checkpointing`` of model, optimizer, LR schedule, RNG, step.

On-disk layout under a checkpoint root (e.g. ``<run dir>/checkpoints``)::

    latest              text file naming the newest complete checkpoint, e.g. "step_00000300"
    step_00000200/      complete checkpoints (megatron's sharded format + common.pt)
    step_00000300/
    step_00000400.tmp/  a save in progress, or one that crashed; never read, removed by the next save

Atomicity: every rank writes its shards into ``step_N.tmp/``; rank 0 then fsyncs the tree,
renames it to ``step_N/`` (atomic within a filesystem), fsyncs the root, and only then replaces
``latest`` (written to ``latest.tmp``, fsynced, ``os.replace``d). A crash at any point leaves
``latest`` naming the previous complete checkpoint. Old checkpoints beyond ``keep`` are deleted
after ``latest`` has moved on, so the one it names is never removed.

Resharding: model and optimizer state are saved as megatron ``ShardedTensor``s keyed by their
global shape, so a checkpoint saved under one TP/PP/EP layout loads under another. RNG states
(python, numpy, torch, CUDA and megatron's tensor-parallel tracker) are per rank: they are restored
only when the layout is the same, and otherwise left as the new run seeded them (with a warning),
because no mapping between differently-sharded random streams exists.

Every function here is collective over the trainer world (all ranks call it, same arguments). The
filesystem must be shared by all ranks, as ``dist_checkpointing`` requires. megatron's writer
starts helper processes with the ``spawn`` method, so the program's entry point needs an
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import re
import shutil
import signal
import warnings
from dataclasses import dataclass, field
from multiprocessing.managers import SyncManager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from hetrl.trainer.hf_convert import default_process_groups, unwrap
from hetrl.trainer.optim import use_fused_adam

LATEST = "latest"
_STEP_DIR = re.compile(r"step_(\d+)")
# The same on save and load: it fixes how optimizer state is keyed (and so what can be resharded).
_SHARDING_FORMAT = {"distrib_optim_sharding_type": "fully_sharded_model_space", "chained_optim_avoid_prefix": True}


# Signals a scheduler sends every process of a job to ask for a checkpoint (see hetrl.loop.preempt).
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def _ignore_stop_signals() -> None:
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def start_checkpoint_writer() -> None:
    """Start the helper process megatron's checkpoint writer reports through, immune to stop signals.

    megatron's ``FileSystemWriterAsync`` collects write results through a ``multiprocessing``
    Manager queue whose server process it spawns on the first save. Spawned like that it sits in
    the trainer's process group, and the SIGTERM with which Slurm (or the local launcher) asks the
    job for a checkpoint kills it: the very save the signal asks for then fails (EOFError, or
    "connection refused" when the server died after an earlier save). Started here, it ignores
    those signals; it still ends with the trainer (the Manager's finalizer) or on SIGKILL.
    Idempotent; call it early, before a signal can arrive (the trainer role does, at start-up).
    """
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if getattr(filesystem_async, "_results_queue", None) is not None:
        return
    if not hasattr(filesystem_async, "_results_queue"):
        raise RuntimeError(
            "megatron-core's FileSystemWriterAsync no longer keeps a module-level _results_queue: "
            "revisit hetrl.trainer.checkpoint.start_checkpoint_writer for this version"
        )
    manager = SyncManager(ctx=multiprocessing.get_context("spawn"))
    manager.start(initializer=_ignore_stop_signals)
    filesystem_async._results_queue = manager.Queue()


@dataclass(frozen=True)
class ResumeState:
    """What :func:`load_checkpoint` restored besides the tensors."""

    path: Path
    step: int
    extra: dict[str, Any] = field(default_factory=dict)
    rng_restored: bool = False


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def latest_checkpoint(root: str | Path) -> Path | None:
    """The complete checkpoint ``latest`` names under ``root``; None when nothing was saved yet."""
    pointer = Path(root) / LATEST
    if not pointer.exists():
        return None
    target = Path(root) / pointer.read_text().strip()
    if not target.is_dir():
        raise RuntimeError(
            f"{pointer} names {target.name}, which does not exist: the checkpoint root was modified by hand"
        )
    return target


# --- filesystem protocol (rank 0 only) ----------------------------------------------------------


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """Flush every file and directory below ``root`` (and itself) to stable storage."""
    for directory, _, files in os.walk(root):
        for name in files:
            _fsync_path(Path(directory) / name)
        _fsync_path(Path(directory))


def _write_pointer(root: Path, name: str) -> None:
    tmp = root / (LATEST + ".tmp")
    with open(tmp, "w") as handle:
        handle.write(name + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, root / LATEST)
    _fsync_path(root)


def publish(tmp: Path, final: Path) -> None:
    """Make the fully written ``tmp`` directory the checkpoint ``final`` and point ``latest`` at it."""
    _fsync_tree(tmp)
    os.rename(tmp, final)
    _fsync_path(final.parent)
    _write_pointer(final.parent, final.name)


def remove_stale(root: Path, keep: int) -> None:
    """Delete crashed ``*.tmp`` saves and all but the newest ``keep`` complete checkpoints."""
    current = latest_checkpoint(root)
    complete = []
    for path in root.iterdir():
        if path.is_dir() and path.name.endswith(".tmp") and _STEP_DIR.fullmatch(path.name[:-4]):
            shutil.rmtree(path)
        elif path.is_dir() and _STEP_DIR.fullmatch(path.name):
            complete.append(path)
    complete.sort(key=lambda p: int(_STEP_DIR.fullmatch(p.name).group(1)))
    for path in complete[:-keep]:
        if path != current:
            shutil.rmtree(path)


# --- state --------------------------------------------------------------------------------------


def _layout(pg) -> dict[str, int]:
    return {
        "world": dist.get_world_size(),
        "tp": pg.tp.size(),
        "pp": pg.pp.size(),
        "ep": pg.ep.size(),
        "dp_cp": pg.dp_cp.size(),
    }


def _rng_state() -> dict[str, Any]:
    from megatron.core import tensor_parallel

    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    from megatron.core import tensor_parallel

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


def _rng_object(rank: int, world: int, state: dict[str, Any] | None):
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    return ShardedObject("hetrl.rng_state", state, (world,), (rank,), replica_id=0)


def _sharded_state(model, optimizer, pg, *, is_loading: bool, name: str = "model") -> dict[str, Any]:
    """``{name: model state, name_optimizer: optimizer state}``; a second model (the critic) gets its own key prefix."""
    # A fresh dict each call: megatron adds the data-parallel group to it in place.
    metadata = {**_SHARDING_FORMAT, "dp_cp_group": pg.dp_cp}
    model_sd = unwrap(model).sharded_state_dict(prefix="" if name == "model" else f"{name}.", metadata=metadata)
    state = {name: model_sd}
    if optimizer is not None:
        state["optimizer" if name == "model" else f"{name}_optimizer"] = optimizer.sharded_state_dict(
            model_sd, is_loading=is_loading, metadata=metadata
        )
    return state


# --- save / load --------------------------------------------------------------------------------


def save_checkpoint(
    root: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer=None,  # megatron.core.optimizer.MegatronOptimizer
    scheduler=None,  # megatron.core.optimizer_param_scheduler.OptimizerParamScheduler
    *,
    extra: dict[str, Any] | None = None,
    keep: int = 2,
    pg_collection=None,
    critic: tuple[Any, Any, Any] | None = None,
) -> Path:
    """Save a checkpoint of ``step`` atomically under ``root``; returns its directory.

    ``critic`` is PPO's value model as ``(model, optimizer, scheduler)``, saved beside the policy in
    the same checkpoint (one atomic publish for both).

    ``extra`` is picklable loop state (data cursor, counters...) meant to be identical on every
    rank: rank 0's copy is saved (megatron only warns when ranks differ); it comes back as
    :attr:`ResumeState.extra`. A step that already has a complete
    checkpoint is not saved again (its directory is returned), so a save right after a resume is
    a no-op rather than a window in which ``latest`` could name a half-replaced directory.
    """
    from megatron.core import dist_checkpointing

    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    pg = pg_collection or default_process_groups()
    root = Path(root)
    final, tmp = root / step_dir_name(step), root / (step_dir_name(step) + ".tmp")
    rank = dist.get_rank()
    decision = [None]
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        decision = [final.is_dir()]
        if not decision[0]:
            if tmp.exists():
                shutil.rmtree(tmp)  # a crashed attempt at this very step
            tmp.mkdir()  # dist_checkpointing.save wants an existing, empty directory
    dist.broadcast_object_list(decision, src=0)
    if decision[0]:
        warnings.warn(f"checkpoint {final} already exists: not saving step {step} again", stacklevel=2)
        return final
    start_checkpoint_writer()
    state = _sharded_state(model, optimizer, pg, is_loading=False)
    if critic is not None:
        state.update(_sharded_state(critic[0], critic[1], pg, is_loading=False, name="critic"))
    state["rng"] = _rng_object(rank, dist.get_world_size(), _rng_state())
    state["hetrl"] = {
        "step": step,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "has_critic": critic is not None,
        "critic_scheduler": critic[2].state_dict() if critic is not None and critic[2] is not None else None,
        "extra": dict(extra or {}),
        "layout": _layout(pg),
    }
    dist_checkpointing.save(state, str(tmp), content_metadata=dict(_SHARDING_FORMAT))
    dist.barrier()
    if rank == 0:
        publish(tmp, final)
        remove_stale(root, keep)
    dist.barrier()
    return final


def load_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer=None,
    scheduler=None,
    *,
    load_rng: bool = True,
    pg_collection=None,
    critic: tuple[Any, Any, Any] | None = None,
) -> ResumeState:
    """Restore a checkpoint into ``model`` (and ``optimizer``, ``scheduler``, RNG, ``critic``) in place.

    ``path`` is a checkpoint root (its ``latest`` is loaded) or one checkpoint directory. The
    current TP/PP/EP layout may differ from the saved one (see the module docstring for RNG).
    """
    from megatron.core import dist_checkpointing

    pg = pg_collection or default_process_groups()
    path = Path(path)
    if (path / LATEST).exists():
        path = latest_checkpoint(path)
    if not path.is_dir() or path.name.endswith(".tmp"):
        raise FileNotFoundError(
            f"{path} is not a complete checkpoint directory (a step_N/ directory or a root with a 'latest' file)"
        )
    common = dist_checkpointing.load_common_state_dict(str(path))["hetrl"]
    same_layout = common["layout"] == _layout(pg)
    request = _sharded_state(model, optimizer, pg, is_loading=True)
    if critic is not None:
        if not common.get("has_critic"):
            raise ValueError(f"{path} holds no value model: it was not saved by a PPO run (algorithm.name=ppo)")
        request.update(_sharded_state(critic[0], critic[1], pg, is_loading=True, name="critic"))
    if load_rng and same_layout:
        request["rng"] = _rng_object(dist.get_rank(), dist.get_world_size(), None)
    elif load_rng:
        warnings.warn(
            f"checkpoint layout {common['layout']} differs from this run's {_layout(pg)}: RNG states not restored",
            stacklevel=2,
        )
    loaded = dist_checkpointing.load(request, str(path))
    unwrap(model).load_state_dict(loaded["model"])
    if optimizer is not None:
        optimizer.load_state_dict(loaded["optimizer"])
        use_fused_adam(optimizer)
    if scheduler is not None and common["scheduler"] is not None:
        scheduler.load_state_dict(common["scheduler"])
    if critic is not None:
        unwrap(critic[0]).load_state_dict(
            {key.removeprefix("critic."): value for key, value in loaded["critic"].items()}
        )
        if critic[1] is not None:
            critic[1].load_state_dict(loaded["critic_optimizer"])
            use_fused_adam(critic[1])
        if critic[2] is not None and common["critic_scheduler"] is not None:
            critic[2].load_state_dict(common["critic_scheduler"])
    if "rng" in loaded:
        _set_rng_state(loaded["rng"])
    return ResumeState(path=path, step=common["step"], extra=common["extra"], rng_restored="rng" in loaded)
