"""Stream a sharded megatron ``GPTModel`` out as full HF-named tensors, in size-bounded buckets.

This is what weight sync and HF export both use. The contract, across the trainer world:

* **Who calls**: every rank of the trainer's ``torch.distributed`` world calls
  :func:`iter_hf_weight_buckets` with the same arguments and iterates the returned iterator to
  exhaustion, in the same order relative to its other collectives. Ranks that hold nothing needed
  (data-parallel replicas) return at once; the others take part in collectives as they go.
* **Who gets what**: global rank 0 gets the buckets: lists of ``(hf_name, tensor)`` with full
  (unsharded, vocab-unpadded) tensors on the model's device, in HF order (embedding, layers with
  their experts, final norm, head). Every other rank's iterator yields nothing.
* **Memory**: one parameter is gathered at a time. Rank 0 holds at most one bucket (at most
  ``bucket_bytes``, or one tensor if that alone is larger) plus the tensor being gathered; the
  tensors of a bucket are fresh copies, never views of the live parameters, so the consumer may
  keep them while training continues. No rank ever holds a second full copy of the model.
* **Collectives**: a one-off ``all_gather_object`` of the plan (names, shapes, owners), then per
  parameter a ``gather`` over its tensor-parallel (or expert-tensor-parallel) group to the group's
  first rank, and a ``send``/``recv`` from there to rank 0 when that first rank is not rank 0.
  Only the data-parallel-first replica (``dp_cp`` rank 0 for dense, ``expt_dp`` rank 0 for expert
  parameters) takes part; pipeline stages and expert-parallel ranks each contribute their own.

:func:`save_hf_checkpoint` writes the same stream to an HF safetensors directory on rank 0.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from hetrl.models.hf import hf_config, save_llava_processor
from hetrl.models.tokenizer import build_char_tokenizer
from hetrl.trainer.hf_convert import (
    SHARD_DIM,
    Layout,
    ParamMap,
    default_process_groups,
    hf_from_shards,
    param_maps,
    unwrap,
)
from hetrl.transport.weights.base import Bucket, bucketize


@dataclass(frozen=True)
class _PlanEntry:
    """One parameter to export: who leads it, which ranks hold its shards, what comes out."""

    sort_key: tuple
    pm: ParamMap
    leader: int  # global rank that assembles the full tensors
    group_ranks: tuple[int, ...]  # global ranks whose shards are gathered (leader first)
    outputs: tuple[tuple[str, tuple[int, ...], torch.dtype], ...]  # (hf name, shape, dtype)


def _world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _local_plan(
    model: torch.nn.Module, pg, layout: Layout, dtype: torch.dtype | None, include_frozen: bool
) -> tuple[list[_PlanEntry], dict[str, tuple[ParamMap, object]]]:
    """Entries this rank leads, and every map it takes part in (with its gather group or None)."""
    rank, _ = _world()
    params = dict(model.named_parameters())
    led, members = [], {}
    for index, pm in enumerate(param_maps(model, pg)):
        replica, group = (pg.expt_dp, pg.expt_tp) if pm.expert else (pg.dp_cp, pg.tp)
        if replica.rank() != 0 or not pm.exported or (pm.frozen and not include_frozen):
            continue  # another data-parallel replica exports this parameter, or it never changes
        if SHARD_DIM[pm.kind] is None:
            if group.rank() != 0:
                continue  # replicated over the group: its first rank alone sends it
            group, ranks = None, (rank,)
        else:
            ranks = tuple(dist.get_process_group_ranks(group))
        members[pm.megatron_name] = (pm, group)
        if ranks[0] != rank:
            continue
        param = params[pm.megatron_name]
        meta = torch.empty(param.shape, dtype=dtype or param.dtype, device="meta")
        outputs = tuple((name, tuple(t.shape), t.dtype) for name, t in hf_from_shards(pm, [meta] * len(ranks), layout))
        led.append(_PlanEntry((pm.order, index), pm, rank, ranks, outputs))
    return led, members


def _global_plan(led: list[_PlanEntry]) -> list[_PlanEntry]:
    _, world_size = _world()
    gathered = [led]
    if world_size > 1:
        gathered = [None] * world_size
        dist.all_gather_object(gathered, led)
    return sorted((e for entries in gathered for e in entries), key=lambda e: (e.sort_key, e.leader))


def _assemble(
    entry: _PlanEntry, param: torch.Tensor, group, layout: Layout, dtype: torch.dtype | None
) -> list[tuple[str, torch.Tensor]] | None:
    """Gather ``param``'s shards to the entry's leader; the leader gets the HF tensors, others None."""
    shard = param.detach()
    if group is None:
        shards = [shard]
    else:
        is_leader = group.rank() == 0
        shards = [torch.empty_like(shard) for _ in entry.group_ranks] if is_leader else None
        dist.gather(shard.contiguous(), shards, group=group, group_dst=0)
        if not is_leader:
            return None
    return [(name, t.to(dtype) if dtype is not None else t) for name, t in hf_from_shards(entry.pm, shards, layout)]


def iter_hf_tensors(
    model: torch.nn.Module,
    vocab_size: int,
    dtype: torch.dtype | None = None,
    pg_collection=None,
    *,
    include_frozen: bool = False,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full tensor)`` on rank 0, one parameter gathered at a time.

    The unbucketed stream behind :func:`iter_hf_weight_buckets` (same calling contract, see the
    module docstring): other ranks yield nothing but must iterate it to the end.
    """
    bare = unwrap(model)
    pg = pg_collection or default_process_groups()
    layout = Layout.of(bare, vocab_size)
    rank, _ = _world()
    params = dict(bare.named_parameters())
    led, members = _local_plan(bare, pg, layout, dtype, include_frozen)
    device = next(iter(params.values())).device
    for entry in _global_plan(led):
        tensors = None
        if rank in entry.group_ranks:
            pm, group = members[entry.pm.megatron_name]
            tensors = _assemble(entry, params[pm.megatron_name], group, layout, dtype)
        if rank == entry.leader and rank != 0:
            for _, tensor in tensors:
                dist.send(tensor.contiguous(), dst=0)
        if rank != 0:
            continue
        if entry.leader != 0:
            tensors = []
            for name, shape, out_dtype in entry.outputs:
                buffer = torch.empty(shape, dtype=out_dtype, device=device)
                dist.recv(buffer, src=entry.leader)
                tensors.append((name, buffer))
        yield from tensors


def iter_hf_weight_buckets(
    model: torch.nn.Module,
    vocab_size: int,
    bucket_bytes: int = 512 << 20,
    dtype: torch.dtype | None = None,
    pg_collection=None,
    *,
    include_frozen: bool = False,
) -> Iterator[Bucket]:
    """Yield the model's full HF tensors to rank 0 in buckets of at most ``bucket_bytes``.

    See the module docstring for which ranks must call it and what they get. ``vocab_size`` is the
    HF vocabulary (``ModelConfig.vocab_size``): padded embedding rows are dropped. ``dtype``
    casts on the sending side (e.g. bf16 for an engine), None keeps the parameters' dtype. A
    tensor larger than ``bucket_bytes`` travels alone in its bucket. Parameters that never train
    (``hetrl.trainer.vision.FROZEN_ATTR``: a frozen vision tower, LLaVA's unused
    ``post_layernorm``) are left out, as a weight push wants (the engines already hold them),
    unless ``include_frozen`` (a complete checkpoint).
    """
    return bucketize(
        iter_hf_tensors(model, vocab_size, dtype, pg_collection, include_frozen=include_frozen), bucket_bytes
    )


def save_hf_checkpoint(
    model: torch.nn.Module,
    model_cfg,  # hetrl.config.model.ModelConfig
    out_dir: str | Path,
    *,
    max_shard_bytes: int = 2 << 30,
    dtype: torch.dtype | None = None,
    copy_files_from: str | Path | None = None,
    pg_collection=None,
) -> Path | None:
    """Write the model as an HF safetensors checkpoint (config.json included) on rank 0.

    Collective like :func:`iter_hf_weight_buckets`; returns the directory on rank 0, None
    elsewhere. Weight files already in ``out_dir`` are replaced. Each bucket becomes one
    ``model-XXXXX-of-YYYYY.safetensors`` file (a lone
    ``model.safetensors`` when one suffices) with an HF index. ``copy_files_from`` copies the
    tokenizer and other non-weight files of an HF directory (e.g. the one imported from). A LLaVA
    policy's directory also gets a ``LlavaProcessor`` when none was copied (see
    :func:`_write_llava_processor`), so ``AutoProcessor`` and ``AutoModelForImageTextToText`` load it.
    Every tensor is written, frozen ones included.
    """
    from safetensors.torch import save_file

    rank, _ = _world()
    out = Path(out_dir)
    written: list[tuple[Path, list[str], int]] = []
    buckets = iter_hf_weight_buckets(
        model, model_cfg.vocab_size, max_shard_bytes, dtype, pg_collection, include_frozen=True
    )
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    for index, bucket in enumerate(buckets):
        path = out / f"part-{index:05d}.safetensors.tmp"
        save_file({name: t.cpu().contiguous() for name, t in bucket}, str(path), metadata={"format": "pt"})
        written.append((path, [name for name, _ in bucket], sum(t.numel() * t.element_size() for _, t in bucket)))
    if rank != 0:
        return None
    for stale in [*out.glob("*.safetensors"), *out.glob("*.safetensors.index.json")]:
        stale.unlink()  # weights of an earlier export would shadow or mix with these
    _finish_safetensors_files(out, written)
    hf_config(model_cfg).save_pretrained(out)
    if copy_files_from is not None:
        _copy_non_weight_files(Path(copy_files_from), out)
    if model_cfg.is_vlm and not (out / _PROCESSOR_FILE).exists():
        _write_llava_processor(out, model_cfg)
    return out


_PROCESSOR_FILE = "processor_config.json"


def _write_llava_processor(out: Path, model_cfg) -> None:  # noqa: ANN001 - a ModelConfig
    """The ``LlavaProcessor`` beside a LLaVA checkpoint whose source directory had none: with the
    tokenizer already in ``out``, else the character tokenizer with its ``<image>`` token (written too)."""
    import transformers

    if (out / "tokenizer_config.json").exists():
        tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    else:
        tokenizer = build_char_tokenizer(model_cfg.vocab_size, image_token=True)
    save_llava_processor(out, model_cfg, tokenizer)


def _finish_safetensors_files(out: Path, written: list[tuple[Path, list[str], int]]) -> None:
    """Give the parts HF's file names and, for several parts, write the index."""
    if len(written) == 1:
        written[0][0].replace(out / "model.safetensors")
        return
    weight_map, total = {}, 0
    for number, (path, names, num_bytes) in enumerate(written, start=1):
        final = f"model-{number:05d}-of-{len(written):05d}.safetensors"
        total += num_bytes
        path.replace(out / final)
        weight_map.update(dict.fromkeys(names, final))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True))


def _copy_non_weight_files(src: Path, out: Path) -> None:
    for path in src.iterdir():
        if (
            path.is_file()
            and not path.name.endswith((".safetensors", ".safetensors.index.json"))
            and path.name != "config.json"
        ):
            shutil.copy2(path, out / path.name)
