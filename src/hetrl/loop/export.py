"""Take a trained policy out of a run as an HF checkpoint: ``python launch.py export RUN [step=N] out=DIR``.

A run's trainer checkpoints (``RUN/checkpoints/step_N``) are megatron ``dist_checkpointing``
directories in whatever TP/PP/EP layout the run trained with. :func:`export_trainer_checkpoint`
loads one into a single-process trainer (a torch.distributed world of 1: dist_checkpointing
reshards any saved layout to it) and writes it with the exporter the weight push uses, so the
result is what the engines served. The tokenizer (with its chat template) comes from the run's
``initial_model``, or from the recipe's tokenizer / HF checkpoint. ``launch.py eval`` scores
trainer checkpoints through the same export.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Literal

from hetrl.config.loader import validate_tree
from hetrl.config.schema import HetrlConfig
from hetrl.control import rundir
from hetrl.control.rendezvous import free_port
from hetrl.models.tokenizer import save_char_tokenizer

logger = logging.getLogger(__name__)

CheckpointKind = Literal["hf", "trainer"]
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


class CheckpointError(ValueError):
    """The checkpoint path is missing, of no known format, or does not fit the recipe."""


def resolve_checkpoint(path: str | Path) -> tuple[CheckpointKind, Path]:
    """The checkpoint's format and the directory to read (a trainer root resolves to its latest step)."""
    from hetrl.trainer.checkpoint import LATEST, latest_checkpoint  # lazy: torch; `eval` of an HF dir needs none

    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if not path.is_dir():
        raise CheckpointError(
            f"checkpoint {path} is a file: pass an HF checkpoint directory or a run's checkpoints/ (or step_N/) "
            f"directory"
        )
    if (path / "config.json").exists() and any(path.glob("*.safetensors")):
        return "hf", path
    if (path / LATEST).exists():
        return "trainer", latest_checkpoint(path)
    if (path / "metadata.json").exists() and (path / "common.pt").exists():
        return "trainer", path
    if path.name.endswith(".tmp"):
        raise CheckpointError(
            f"{path} is an unfinished trainer checkpoint save (a .tmp directory): use a complete step_N directory"
        )
    raise CheckpointError(
        f"{path} is neither an HF checkpoint (config.json + *.safetensors) nor a hetrl trainer checkpoint "
        "(RUN/checkpoints with a 'latest' file, or a step_N directory with metadata.json + common.pt)"
    )


def run_dir_of(step_dir: Path) -> Path:
    """RUN for RUN/checkpoints/step_N (the layout of the trainer role)."""
    return step_dir.parent.parent


def tokenizer_source(cfg: HetrlConfig, step_dir: Path) -> Path | None:
    """Where the tokenizer of a trainer checkpoint comes from; None: the built-in character tokenizer."""
    candidates = [run_dir_of(step_dir) / rundir.INITIAL_MODEL, cfg.model.tokenizer, cfg.model.hf_checkpoint]
    for candidate in candidates:
        if candidate and any((Path(candidate) / name).exists() for name in _TOKENIZER_FILES):
            return Path(candidate)
    if cfg.model.hf_checkpoint is None and cfg.model.tokenizer is None:
        return None  # a random-init model of the recipe's shape uses the character tokenizer
    raise CheckpointError(
        f"no tokenizer found for {step_dir}: looked in {[str(c) for c in candidates if c]}; set model.tokenizer=DIR"
    )


def export_trainer_checkpoint(cfg: HetrlConfig, step_dir: Path, out_dir: Path) -> Path:
    """Load a trainer checkpoint in this process (world of 1) and write it as an HF checkpoint to ``out_dir``."""
    # lazy: torch and megatron, only for a trainer checkpoint's export
    import torch
    import torch.distributed as dist

    from hetrl.trainer.checkpoint import load_checkpoint
    from hetrl.trainer.exporter import save_hf_checkpoint
    from hetrl.trainer.parallel import destroy_parallel
    from hetrl.trainer.policy import PolicyTrainer

    tokenizer_dir = tokenizer_source(cfg, step_dir)
    owns_world = not dist.is_initialized()
    if owns_world:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    elif dist.get_world_size() != 1:
        raise RuntimeError(
            f"standalone eval runs in a torch.distributed world of 1; this process is in one of {dist.get_world_size()}"
        )
    single = cfg.trainer.model_copy(
        update={
            "tensor_parallel": 1,
            "pipeline_parallel": 1,
            "expert_parallel": 1,
            "context_parallel": 1,
            "sequence_parallel": False,
            "distributed_optimizer": False,
        }
    )
    try:
        trainer = PolicyTrainer(cfg.model, single, cfg.algorithm, seed=cfg.run.seed, with_reference=False)
        try:
            state = load_checkpoint(step_dir, trainer.model, load_rng=False, pg_collection=trainer.groups.pg_collection)
        except (RuntimeError, KeyError, ValueError) as error:
            raise CheckpointError(
                f"could not load trainer checkpoint {step_dir} into the recipe's model ({error}); "
                "is it the recipe (and model.* overrides) the checkpoint was trained with?"
            ) from error
        save_hf_checkpoint(
            trainer.module,
            cfg.model,
            out_dir,
            copy_files_from=tokenizer_dir,
            pg_collection=trainer.groups.pg_collection,
        )
        if tokenizer_dir is None:
            save_char_tokenizer(out_dir, cfg.model.vocab_size, image_token=cfg.model.is_vlm)
        logger.info("exported %s (policy version %s) to %s", step_dir, state.extra.get("version"), out_dir)
        del trainer
    finally:
        destroy_parallel(destroy_world=owns_world)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the engine that follows wants the memory
    return out_dir


def export_run(run_dir: str | Path, out_dir: str | Path, step: int | None = None) -> Path:
    """Write the policy of run ``run_dir`` at checkpoint ``step`` (default: the latest) to ``out_dir``.

    ``out_dir`` must not exist or be empty: an export never mixes its files with others. The export
    is written beside it and renamed into place, so a failed one leaves nothing half-written.
    """
    import yaml

    from hetrl.trainer.checkpoint import step_dir_name  # lazy: torch, after the command line is checked

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    config = run_dir / rundir.CONFIG
    if not config.exists():
        raise CheckpointError(f"{run_dir} is not a run directory (no {rundir.CONFIG})")
    root = rundir.checkpoint_root(run_dir)
    saved = sorted(
        int(path.name.removeprefix("step_"))
        for path in root.glob("step_*")
        if path.name.removeprefix("step_").isdigit()
    )
    if not saved:
        raise CheckpointError(f"run {run_dir} has no trainer checkpoint yet (nothing in {root})")
    if step is not None and step not in saved:
        raise CheckpointError(
            f"run {run_dir} has no checkpoint of step {step}; saved steps: {', '.join(map(str, saved))}"
        )
    _, step_dir = resolve_checkpoint(root if step is None else root / step_dir_name(step))
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise CheckpointError(f"{out_dir} exists and is not an empty directory: export into a new one")
    cfg = validate_tree(yaml.safe_load(config.read_text()))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        export_trainer_checkpoint(cfg, step_dir, staging)
        if out_dir.exists():
            out_dir.rmdir()
        os.replace(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir
