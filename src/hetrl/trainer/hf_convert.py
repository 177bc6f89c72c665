"""HF safetensors <-> megatron-core ``GPTModel``: the name map, the shard math, and the importer.

Llama, Qwen2, Qwen3 and Qwen3-MoE checkpoints share one HF naming scheme (``model.layers.{i}.
self_attn.q_proj.weight`` ...); what differs is which tensors exist (qkv biases, q/k norms, a router
and per-expert MLPs), and that is also what differs between the megatron models
``hetrl.trainer.model.build_gpt_model`` builds for them. So the map is driven by the megatron
model's own parameters: every parameter of this rank maps to one or more HF tensors
(:class:`ParamMap`), and a parameter without a rule is an error, never silently skipped.

Layouts that are not a plain copy (megatron on the left, HF on the right):

* ``linear_qkv`` (weight, and bias for Qwen2) fuses q/k/v *per query group*: for each of the
  ``G`` groups, its ``heads_per_group`` query heads, then its key head, then its value head
  (``[G, (hpg + 2) * head_dim, ...]``). Tensor parallelism splits whole groups, so TP rank ``r``
  holds groups ``r*G/tp .. (r+1)*G/tp`` of q, k and v.
* ``linear_fc1`` fuses the SwiGLU ``gate_proj`` and ``up_proj``: each TP rank holds
  ``[gate rows of rank r; up rows of rank r]``.
* embedding and output layer rows are the vocabulary, padded to a multiple of TP; the importer
  fills padded rows with zeros and the exporter drops them.
* row-parallel layers (``linear_proj``, ``linear_fc2``) split the input dimension (dim 1).
* experts: EP rank ``e`` holds global experts ``e*E/ep .. (e+1)*E/ep``, each sharded over the
  expert-tensor-parallel group like a dense MLP.

Importing reads only this rank's slice of every tensor (safetensors slices are memory-mapped), so
no rank ever materialises the full checkpoint. Exporting lives in ``hetrl.trainer.exporter``,
which gathers shards and turns them back into HF tensors with :func:`hf_from_shards`.

Both local-spec names (CPU) and transformer-engine names (fused ``layer_norm_weight``, grouped
experts ``weight{j}``) are recognised.

LLaVA (``hetrl.trainer.vision``): the language model's HF names start ``model.language_model.``
instead of ``model.`` (``lm_head.weight`` stays), and the ``vision.*`` parameters map to the CLIP
tower ``model.vision_tower.vision_model.*`` (its own ``qkv`` layout: one query head per group) and
the projector ``model.multi_modal_projector.linear_{1,2}.*``: the names vLLM loads, which
transformers loads too. HF's ``post_layernorm`` (unused by LLaVA) is a frozen parameter, so that
export(import(x)) is exact for every tensor.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, Protocol

import torch
import torch.distributed as dist

from hetrl.trainer.model import ValueHead
from hetrl.trainer.vision import is_frozen

Kind = Literal["replicated", "flat", "column", "row", "qkv", "gate_up", "vocab"]

# Partition dimension of each kind's TP shards (None: every rank holds the full tensor). "flat" is
# replicated and 1-D in HF (CLIP's class embedding; megatron's class token is [1, 1, hidden]).
SHARD_DIM: dict[str, int | None] = {
    "replicated": None,
    "flat": None,
    "column": 0,
    "row": 1,
    "qkv": 0,
    "gate_up": 0,
    "vocab": 0,
}


@dataclass(frozen=True)
class ParamMap:
    """One megatron parameter of this rank and the HF tensors it is made of.

    ``order`` sorts parameters of all ranks into HF order (embedding, layers, final norm, head),
    so that exports are deterministic whatever the layout. ``exported`` is False for the last
    pipeline stage's copy of a tied embedding: it is imported, but the embedding is exported once.
    """

    megatron_name: str
    hf_names: tuple[str, ...]
    kind: Kind
    expert: bool
    order: tuple[int, int, int]
    exported: bool = True
    frozen: bool = False  # never trains (hetrl.trainer.vision.FROZEN_ATTR): weight pushes leave it out


@dataclass(frozen=True)
class Layout:
    """Shapes the fused layouts depend on (from the megatron ``TransformerConfig``)."""

    num_query_groups: int
    heads_per_group: int
    head_dim: int
    vocab_size: int  # HF (unpadded) vocabulary
    padded_vocab_size: int  # the model's embedding rows (a multiple of TP)
    vision: Layout | None = None  # the ViT's attention shape (LLaVA's first pipeline stage)

    @classmethod
    def of(cls, model: torch.nn.Module, vocab_size: int) -> Layout:
        bare = unwrap(model)
        config = bare.config
        groups = config.num_query_groups or config.num_attention_heads
        if bare.vocab_size < vocab_size:
            raise ValueError(
                f"the model's vocabulary ({bare.vocab_size} rows) is smaller than the HF checkpoint's ({vocab_size})"
            )
        vision = None
        if hasattr(bare, "vision"):
            vit = bare.vision.encoder.config
            vision = cls(vit.num_attention_heads, 1, vit.kv_channels, 0, 0)
        return cls(
            groups, config.num_attention_heads // groups, config.kv_channels, vocab_size, bare.vocab_size, vision
        )

    def of_param(self, pm: ParamMap) -> Layout:
        """The layout ``pm``'s fused tensors follow: the ViT's for vision parameters, else the language model's."""
        return self.vision if pm.megatron_name.startswith("vision.") and self.vision is not None else self


def unwrap(model: torch.nn.Module | Sequence[torch.nn.Module]) -> torch.nn.Module:
    """The bare ``GPTModel`` inside DDP / Float16Module wrappers (one model chunk only)."""
    if isinstance(model, Sequence):
        if len(model) != 1:
            raise ValueError(f"virtual pipeline stages are not supported: got {len(model)} model chunks")
        model = model[0]
    while hasattr(model, "module"):
        model = model.module
    return model


def default_process_groups():
    """megatron's own groups (``parallel_state``) as a ``ProcessGroupCollection``."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    return ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp", "pp", "ep", "expt_tp", "dp_cp", "expt_dp"])


# --- the name map -------------------------------------------------------------------------------

_ATTN = "model.layers.{i}.self_attn."
_MLP = "model.layers.{i}.mlp."
# (megatron suffix within a layer, kind, HF names); suffixes are matched in full.
_LAYER_RULES: tuple[tuple[str, Kind, tuple[str, ...]], ...] = (
    (
        r"input_layernorm\.weight|self_attention\.linear_qkv\.layer_norm_weight",
        "replicated",
        ("model.layers.{i}.input_layernorm.weight",),
    ),
    (r"self_attention\.linear_qkv\.weight", "qkv", tuple(_ATTN + p + "_proj.weight" for p in "qkv")),
    (r"self_attention\.linear_qkv\.bias", "qkv", tuple(_ATTN + p + "_proj.bias" for p in "qkv")),
    (r"self_attention\.linear_proj\.weight", "row", (_ATTN + "o_proj.weight",)),
    (r"self_attention\.q_layernorm\.weight", "replicated", (_ATTN + "q_norm.weight",)),
    (r"self_attention\.k_layernorm\.weight", "replicated", (_ATTN + "k_norm.weight",)),
    (
        r"pre_mlp_layernorm\.weight|mlp\.linear_fc1\.layer_norm_weight",
        "replicated",
        ("model.layers.{i}.post_attention_layernorm.weight",),
    ),
    (r"mlp\.linear_fc1\.weight", "gate_up", (_MLP + "gate_proj.weight", _MLP + "up_proj.weight")),
    (r"mlp\.linear_fc2\.weight", "row", (_MLP + "down_proj.weight",)),
    (r"mlp\.router\.weight", "replicated", (_MLP + "gate.weight",)),
)
_EXPERT = "model.layers.{i}.mlp.experts.{j}."
_EXPERT_RULES: tuple[tuple[str, Kind, tuple[str, ...]], ...] = (
    (
        r"mlp\.experts\.(?:local_experts\.(?P<a>\d+)\.linear_fc1\.weight|linear_fc1\.weight(?P<b>\d+))",
        "gate_up",
        (_EXPERT + "gate_proj.weight", _EXPERT + "up_proj.weight"),
    ),
    (
        r"mlp\.experts\.(?:local_experts\.(?P<a>\d+)\.linear_fc2\.weight|linear_fc2\.weight(?P<b>\d+))",
        "row",
        (_EXPERT + "down_proj.weight",),
    ),
)
_LAYER_NAME = re.compile(r"decoder\.layers\.(\d+)\.(.+)")

# LLaVA (hetrl.trainer.vision): the CLIP tower and the projector under the names vLLM loads.
_VIT = "model.vision_tower.vision_model."
_VIT_LAYER = _VIT + "encoder.layers.{i}."
_VISION_RULES: tuple[tuple[str, Kind, tuple[str, ...]], ...] = (
    (r"encoder\.class_token", "flat", (_VIT + "embeddings.class_embedding",)),
    (r"encoder\.conv1\.weight", "replicated", (_VIT + "embeddings.patch_embedding.weight",)),
    (r"encoder\.position_embeddings\.weight", "replicated", (_VIT + "embeddings.position_embedding.weight",)),
    (r"encoder\.ln_pre\.(weight|bias)", "replicated", (_VIT + "pre_layrnorm.{p}",)),
    (r"post_layernorm\.(weight|bias)", "replicated", (_VIT + "post_layernorm.{p}",)),
    (r"projector\.encoder\.linear_fc1\.(weight|bias)", "column", ("model.multi_modal_projector.linear_1.{p}",)),
    (r"projector\.encoder\.linear_fc2\.(weight)", "row", ("model.multi_modal_projector.linear_2.{p}",)),
    (r"projector\.encoder\.linear_fc2\.(bias)", "replicated", ("model.multi_modal_projector.linear_2.{p}",)),
)
_VIT_LAYER_RULES: tuple[tuple[str, Kind, tuple[str, ...]], ...] = (
    (r"input_layernorm\.(weight|bias)", "replicated", (_VIT_LAYER + "layer_norm1.{p}",)),
    (
        r"self_attention\.linear_qkv\.(weight|bias)",
        "qkv",
        tuple(_VIT_LAYER + f"self_attn.{x}_proj.{{p}}" for x in "qkv"),
    ),
    (r"self_attention\.linear_proj\.(weight)", "row", (_VIT_LAYER + "self_attn.out_proj.{p}",)),
    (r"self_attention\.linear_proj\.(bias)", "replicated", (_VIT_LAYER + "self_attn.out_proj.{p}",)),
    (r"pre_mlp_layernorm\.(weight|bias)", "replicated", (_VIT_LAYER + "layer_norm2.{p}",)),
    (r"mlp\.linear_fc1\.(weight|bias)", "column", (_VIT_LAYER + "mlp.fc1.{p}",)),
    (r"mlp\.linear_fc2\.(weight)", "row", (_VIT_LAYER + "mlp.fc2.{p}",)),
    (r"mlp\.linear_fc2\.(bias)", "replicated", (_VIT_LAYER + "mlp.fc2.{p}",)),
)
_VIT_LAYER_NAME = re.compile(r"encoder\.decoder\.layers\.(\d+)\.(.+)")
# HF text names of a LLaVA checkpoint: its language model's, under this prefix instead of "model."
_LLAVA_TEXT_PREFIX = "model.language_model."


def _vision_map(name: str, frozen: bool) -> ParamMap:
    """The map of a ``vision.*`` parameter (ViT layers sort after the embeddings, the projector last)."""
    suffix = name.removeprefix("vision.")
    rules, layer = _VISION_RULES, -1
    layer_match = _VIT_LAYER_NAME.fullmatch(suffix)
    if layer_match:
        rules, layer, suffix = _VIT_LAYER_RULES, int(layer_match.group(1)), layer_match.group(2)
    for index, (pattern, kind, hf) in enumerate(rules):
        match = re.fullmatch(pattern, suffix)
        if match:
            part = match.group(1) if match.groups() else ""
            order = (5, 0, index) if suffix.startswith("projector.") else (4, 1 + layer, index)
            return ParamMap(name, tuple(h.format(i=layer, p=part) for h in hf), kind, False, order, frozen=frozen)
    raise ValueError(f"no HF mapping for megatron vision parameter {name!r}")


def text_prefix(model: torch.nn.Module) -> str:
    """Where the language model's HF names start (``model.embed_tokens.weight`` ...): ``model.``, or LLaVA's."""
    return _LLAVA_TEXT_PREFIX if getattr(unwrap(model), "hf_layout", None) == "llava" else "model."


def _layer_map(model: torch.nn.Module, name: str, ep_rank: int) -> ParamMap:
    match = _LAYER_NAME.fullmatch(name)
    if match is None:
        raise ValueError(f"no HF mapping for megatron parameter {name!r}")
    local, suffix = int(match.group(1)), match.group(2)
    layer = model.decoder.layers[local].layer_number - 1  # layer_number is global and 1-based
    for pattern, kind, hf in _LAYER_RULES:
        if re.fullmatch(pattern, suffix):
            return ParamMap(name, tuple(h.format(i=layer) for h in hf), kind, False, (1, layer, 0))
    for pattern, kind, hf in _EXPERT_RULES:
        expert_match = re.fullmatch(pattern, suffix)
        if expert_match:
            local_expert = int(expert_match.group("a") or expert_match.group("b"))
            num_local = model.config.num_moe_experts // model.config.expert_model_parallel_size
            expert = ep_rank * num_local + local_expert
            return ParamMap(name, tuple(h.format(i=layer, j=expert) for h in hf), kind, True, (1, layer, 1 + expert))
    raise ValueError(f"no HF mapping for megatron parameter {name!r} (layer suffix {suffix!r})")


def param_maps(model: torch.nn.Module, pg_collection=None) -> list[ParamMap]:
    """The :class:`ParamMap` of every parameter this rank holds, in this rank's parameter order."""
    model = unwrap(model)
    pg = pg_collection or default_process_groups()
    tied = model.share_embeddings_and_output_weights
    maps = []
    for name, param in model.named_parameters():
        if name.startswith("vision."):
            maps.append(_vision_map(name, is_frozen(param)))
        elif name == "embedding.word_embeddings.weight":
            maps.append(ParamMap(name, ("model.embed_tokens.weight",), "vocab", False, (0, 0, 0)))
        elif name == "output_layer.weight" and isinstance(model.output_layer, ValueHead):
            # A value model's ValueHead: HF's token-classification head with one label.
            maps.append(ParamMap(name, ("score.weight",), "replicated", False, (3, 0, 0)))
        elif name == "output_layer.bias":
            maps.append(ParamMap(name, ("score.bias",), "replicated", False, (3, 0, 1)))
        elif name == "output_layer.weight":
            # Tied models keep a copy of the embedding on the last pipeline stage (PP > 1 only).
            hf = "model.embed_tokens.weight" if tied else "lm_head.weight"
            maps.append(ParamMap(name, (hf,), "vocab", False, (3, 0, 0), exported=not tied))
        elif name == "decoder.final_layernorm.weight":
            maps.append(ParamMap(name, ("model.norm.weight",), "replicated", False, (2, 0, 0)))
        else:
            maps.append(_layer_map(model, name, pg.ep.rank()))
    prefix = text_prefix(model)
    if prefix != "model.":
        maps = [
            pm
            if pm.megatron_name.startswith("vision.")
            else replace(
                pm,
                hf_names=tuple(prefix + h.removeprefix("model.") if h.startswith("model.") else h for h in pm.hf_names),
            )
            for pm in maps
        ]
    return maps


# --- shard math ---------------------------------------------------------------------------------


class TensorSource(Protocol):
    """Where HF tensors are read from, slice by slice (see :class:`SafetensorsCheckpoint`)."""

    def shape(self, name: str) -> list[int]: ...

    def read(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor: ...


def shard_from_hf(pm: ParamMap, source: TensorSource, layout: Layout, rank: int, size: int) -> torch.Tensor:
    """Build TP rank ``rank`` of ``size``'s shard of ``pm`` from HF tensors, reading only its rows."""
    first = pm.hf_names[0]
    layout = layout.of_param(pm)
    if pm.kind in ("replicated", "flat"):
        return source.read(first, 0, 0, source.shape(first)[0])
    if pm.kind in ("column", "row"):
        dim = SHARD_DIM[pm.kind]
        step = _even_split(source.shape(first)[dim], size, first)
        return source.read(first, dim, rank * step, (rank + 1) * step)
    if pm.kind == "gate_up":
        step = _even_split(source.shape(first)[0], size, first)
        return torch.cat([source.read(n, 0, rank * step, (rank + 1) * step) for n in pm.hf_names])
    if pm.kind == "qkv":
        return _qkv_shard(pm, source, layout, rank, size)
    return _vocab_shard(pm, source, layout, rank, size)


def _even_split(total: int, size: int, name: str) -> int:
    if total % size:
        raise ValueError(f"{name}: {total} rows/columns cannot be split evenly over {size} tensor-parallel ranks")
    return total // size


def _qkv_shard(pm: ParamMap, source: TensorSource, layout: Layout, rank: int, size: int) -> torch.Tensor:
    groups = _even_split(layout.num_query_groups, size, pm.megatron_name)
    first = rank * groups
    q_rows, kv_rows = layout.heads_per_group * layout.head_dim, layout.head_dim
    q, k, v = (
        source.read(name, 0, first * rows, (first + groups) * rows)
        for name, rows in zip(pm.hf_names, (q_rows, kv_rows, kv_rows))
    )
    rest = q.shape[1:]
    per_group = [t.reshape(groups, -1, *rest) for t in (q, k, v)]
    return torch.cat(per_group, dim=1).reshape(-1, *rest)


def _vocab_shard(pm: ParamMap, source: TensorSource, layout: Layout, rank: int, size: int) -> torch.Tensor:
    """Rows of the padded vocabulary this rank holds; rows past the HF vocabulary are zeros."""
    step = _even_split(layout.padded_vocab_size, size, pm.megatron_name)
    start, stop = rank * step, (rank + 1) * step
    real = source.read(pm.hf_names[0], 0, min(start, layout.vocab_size), min(stop, layout.vocab_size))
    if real.shape[0] == step:
        return real
    return torch.cat([real, real.new_zeros(step - real.shape[0], *real.shape[1:])])


def hf_from_shards(pm: ParamMap, shards: Sequence[torch.Tensor], layout: Layout) -> list[tuple[str, torch.Tensor]]:
    """The full HF tensors of ``pm`` from all TP shards (in TP-rank order): the inverse of
    :func:`shard_from_hf`. Results are fresh tensors, never views of a parameter."""
    layout = layout.of_param(pm)
    if pm.kind == "replicated":
        return [(pm.hf_names[0], shards[0].clone())]
    if pm.kind == "flat":
        return [(pm.hf_names[0], shards[0].reshape(-1).clone())]
    if pm.kind in ("column", "row"):
        return [(pm.hf_names[0], torch.cat(list(shards), dim=SHARD_DIM[pm.kind]))]
    if pm.kind == "vocab":
        return [(pm.hf_names[0], torch.cat(list(shards))[: layout.vocab_size].clone())]
    if pm.kind == "gate_up":
        halves = [s.chunk(2) for s in shards]
        return [(name, torch.cat([h[i] for h in halves])) for i, name in enumerate(pm.hf_names)]
    hpg, dim = layout.heads_per_group, layout.head_dim
    full = torch.cat(list(shards))
    grouped = full.reshape(layout.num_query_groups, (hpg + 2) * dim, *full.shape[1:])
    q, k, v = grouped.split([hpg * dim, dim, dim], dim=1)
    return [(name, t.reshape(-1, *full.shape[1:]).contiguous()) for name, t in zip(pm.hf_names, (q, k, v))]


# --- reading safetensors ------------------------------------------------------------------------


class SafetensorsCheckpoint:
    """Lazy, sliced access to the tensors of an HF checkpoint directory (one or many files)."""

    def __init__(self, hf_dir: str | Path) -> None:
        from safetensors import safe_open

        self.dir = Path(hf_dir)
        index = self.dir / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
        else:
            files = sorted(self.dir.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors files in HF checkpoint directory {self.dir}")
            weight_map = {}
            for file in files:
                with safe_open(str(file), "pt") as handle:
                    weight_map.update(dict.fromkeys(handle.keys(), file.name))
        self.weight_map: dict[str, str] = weight_map
        self._open = safe_open
        self._handles: dict[str, object] = {}

    def _slice(self, name: str):
        if name not in self.weight_map:
            raise KeyError(name)
        file = self.weight_map[name]
        if file not in self._handles:
            self._handles[file] = self._open(str(self.dir / file), "pt")
        return self._handles[file].get_slice(name)

    def shape(self, name: str) -> list[int]:
        return list(self._slice(name).get_shape())

    def read(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
        """Rows (dim 0) or columns (dim 1) ``start:stop`` of tensor ``name``, as a new tensor."""
        tensor_slice = self._slice(name)
        index = (slice(start, stop),) if dim == 0 else (slice(None), slice(start, stop))
        return tensor_slice[index].contiguous()


# --- import -------------------------------------------------------------------------------------


def _group_rank_size(pm: ParamMap, pg) -> tuple[int, int]:
    group = pg.expt_tp if pm.expert else pg.tp
    return (0, 1) if SHARD_DIM[pm.kind] is None else (group.rank(), group.size())


def load_hf_checkpoint(
    model: torch.nn.Module, hf_dir: str | Path, pg_collection=None, *, body_only: bool = False
) -> None:
    """Copy an HF safetensors checkpoint into ``model`` (this rank's shards only), in place.

    ``body_only`` leaves the model's output layer as it is and the checkpoint's head unused: how a
    value model starts from a policy's checkpoint (a fresh value head on the language model).

    Collective: every rank of the trainer world calls it (one ``all_gather_object`` at the end
    checks, on all ranks alike, that every HF tensor was consumed by some rank and that no shape
    disagreed). Call it before the optimizer is built, or call the optimizer's
    ``reload_model_params()`` afterwards, so that fp32 master weights (bf16 training) start from
    the imported values; a reference model copied from the policy must be re-synced too.
    """
    bare = unwrap(model)
    pg = pg_collection or default_process_groups()
    ckpt = SafetensorsCheckpoint(hf_dir)
    embedding = text_prefix(bare) + "embed_tokens.weight"
    if embedding not in ckpt.weight_map:
        layouts = "a LLaVA" if embedding.startswith(_LLAVA_TEXT_PREFIX) else "a Llama/Qwen-layout"
        raise ValueError(f"{hf_dir} has no {embedding}: not {layouts} checkpoint")
    layout = Layout.of(bare, ckpt.shape(embedding)[0])
    params = dict(bare.named_parameters())
    consumed, errors = set(), []
    with torch.no_grad():
        for pm in param_maps(bare, pg):
            if body_only and pm.megatron_name.startswith("output_layer."):
                continue
            rank, size = _group_rank_size(pm, pg)
            param = params[pm.megatron_name]
            try:
                shard = shard_from_hf(pm, ckpt, layout, rank, size)
            except KeyError as missing:
                errors.append(f"{pm.megatron_name}: HF tensor {missing} is missing")
                continue
            if pm.kind == "flat" and shard.numel() == param.numel():
                shard = shard.reshape(param.shape)
            if shard.shape != param.shape:
                errors.append(
                    f"{pm.megatron_name}: shard of {pm.hf_names} has shape {tuple(shard.shape)}, the model's is "
                    f"{tuple(param.shape)}"
                )
                continue
            param.copy_(shard)
            consumed.update(pm.hf_names)
    heads = {"lm_head.weight", "score.weight", "score.bias"} if body_only else set()
    _raise_on_import_errors(set(ckpt.weight_map) - heads, consumed, errors, hf_dir)


def _raise_on_import_errors(available: set[str], consumed: set[str], errors: list[str], hf_dir: str | Path) -> None:
    """Raise the same ValueError on every rank if any rank failed or a tensor went unused."""
    reports = [(consumed, errors)]
    if dist.is_initialized() and dist.get_world_size() > 1:
        reports = [None] * dist.get_world_size()
        dist.all_gather_object(reports, (consumed, errors))
    unused = sorted(available - set().union(*(r[0] for r in reports)))
    all_errors = [e for r in reports for e in r[1]]
    if unused:
        all_errors.append(
            f"HF tensors the model has no parameter for (arch, tie_word_embeddings or num_layers mismatch?): "
            f"{unused[:8]}{' ...' if len(unused) > 8 else ''}"
        )
    if all_errors:
        raise ValueError(f"cannot import {hf_dir}: " + "; ".join(all_errors))
