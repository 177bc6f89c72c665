"""Per-token log-probs and entropy of given tokens, vocab-parallel, over the pipeline schedule.

The output layer's logits stay sharded over tensor-parallel ranks (``[R, T, V/tp]``); nothing
here gathers the full vocabulary. ``log p(y_t)`` comes from megatron's
``vocab_parallel_cross_entropy`` (one max and two sum all-reduces over TP), the entropy
``H = log Z - sum_v p_v z_v`` from the same kind of reductions, differentiable through
``reduce_from_tensor_model_parallel_region`` (all-reduce forward, identity backward: every TP
rank computes the same downstream loss, so each keeps the gradient of its own shard).

Sampling temperature: engines report ``log_softmax(z / T)``; pass the same ``temperature`` so the
trainer's log-probs (and the importance ratios built from them) refer to the same distribution.

:func:`forward_logprobs` runs megatron's forward-only schedule over the micro-batches of a
:class:`hetrl.trainer.batch.TrainBatch` (pipeline-parallel when PP > 1: only the last stage
computes log-probs, then it broadcasts them over the pipeline group so every rank returns them).
Under context parallelism each rank feeds the model its slice of every row and gets whole rows of
log-probs back (:func:`sample_logprobs`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from hetrl.trainer import context_parallel
from hetrl.trainer.batch import MicroBatch, TrainBatch
from hetrl.trainer.parallel import ParallelGroups
from hetrl.trainer.routing_replay import RoutingReplay


def vocab_parallel_entropy(logits: Tensor, tp_group: dist.ProcessGroup | None) -> Tensor:
    """Entropy ``[...]`` of ``softmax`` over the full vocabulary from this rank's shard ``[..., V/tp]``."""
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    logits = logits.float()
    shift = logits.detach().max(dim=-1, keepdim=True).values
    if tp_group is not None and dist.get_world_size(tp_group) > 1:
        dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=tp_group)
    shifted = logits - shift
    exp = shifted.exp()
    sum_exp = exp.sum(-1)
    weighted = (exp * shifted).sum(-1)
    if tp_group is not None and dist.get_world_size(tp_group) > 1:
        sum_exp = reduce_from_tensor_model_parallel_region(sum_exp, tp_group)
        weighted = reduce_from_tensor_model_parallel_region(weighted, tp_group)
    # H = log Z - E_p[z] with z shifted (the shift cancels): log(sum e) - sum(e z) / sum(e)
    return sum_exp.log() - weighted / sum_exp


def token_logprobs(
    logits: Tensor,
    labels: Tensor,
    *,
    tp_group: dist.ProcessGroup | None,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """``(log p(labels), entropy or None)``, both ``[R, T]``, from vocab-sharded logits ``[R, T, V/tp]``.

    megatron's cross entropy overwrites its input in place (as megatron's own LM loss lets it do
    with the output layer's result); it gets a copy only when the entropy still needs the logits.
    """
    from megatron.core import tensor_parallel

    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    scaled = logits.float() / temperature if temperature != 1.0 else logits.float()
    entropy = vocab_parallel_entropy(scaled, tp_group) if with_entropy else None
    ce_input = scaled.clone() if with_entropy else scaled
    logprobs = -tensor_parallel.vocab_parallel_cross_entropy(ce_input.contiguous(), labels)
    return logprobs, entropy


def to_sample_space(per_position: Tensor, mb: MicroBatch) -> Tensor:
    """Model-space ``[R, T]`` values -> sample-space ``[n, Tc]`` via the micro-batch's gather index."""
    return per_position.reshape(-1)[mb.gather_index.to(per_position.device)]


def sample_logprobs(
    logits: Tensor,
    mb: MicroBatch,
    groups: ParallelGroups,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Sample-space ``(log-probs, entropy or None)`` ``[n, Tc]`` of a micro-batch, 0 off the loss mask.

    ``logits`` are the model's output for this rank's slice of the micro-batch (all of it without
    context parallelism). Under CP the per-position values are gathered into whole rows first, so
    the loss sees whole sequences (``hetrl.trainer.context_parallel`` explains the gradients).
    """
    labels = mb.labels
    if groups.cp_size > 1:
        labels = labels[:, context_parallel.local_positions(mb.spans, groups.cp_size, groups.cp_rank)]
    labels = labels.to(logits.device)
    lp, ent = token_logprobs(logits, labels, tp_group=groups.tp, temperature=temperature, with_entropy=with_entropy)
    mask = mb.loss_mask.to(lp.device)
    if groups.cp_size > 1:

        def whole(values: Tensor) -> Tensor:
            return context_parallel.gather_sequence(
                values, groups.pg_collection.cp, dim=1, sum_grads=False, spans=mb.spans
            )

        lp, ent = whole(lp), None if ent is None else whole(ent)
    return to_sample_space(lp, mb) * mask, None if ent is None else to_sample_space(ent, mb) * mask


def packed_seq_params(mb: MicroBatch, device: torch.device):  # -> megatron PackedSeqParams | None
    """megatron's THD description of a packed micro-batch (None for one-sample rows)."""
    from megatron.core.packed_seq_params import PackedSeqParams

    if mb.cu_seqlens is None:
        return None
    longest = max(length for _, length in mb.spans)
    cu, cu_padded = mb.cu_seqlens.to(device), mb.cu_seqlens_padded.to(device)
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        cu_seqlens_q_padded=cu_padded,
        cu_seqlens_kv_padded=cu_padded,
        max_seqlen_q=longest,
        max_seqlen_kv=longest,
    )


def model_forward(
    model: torch.nn.Module, mb: MicroBatch, groups: ParallelGroups, routing: RoutingReplay | None = None
) -> Tensor:
    """This rank's slice of a micro-batch through (this stage of) the GPT model: logits on the last stage, else hidden.

    With ``routing`` the MoE routers take (or are compared with) the micro-batch's engine routing.
    A micro-batch with images hands the model their pixel values and positions (the first stage
    merges their embeddings; context parallelism is refused for such models at build time).
    """
    local = context_parallel.shard_micro_batch(mb, groups.cp_size, groups.cp_rank)
    if routing is not None:
        routing.load(local)
    images = {}
    if mb.pixel_values is not None:  # a vision-language policy (hetrl.trainer.vision.attach_vision) merges them
        images = dict(images=mb.pixel_values.to(groups.device), image_mask=mb.image_mask)
    # Shared-prompt rows: the attention mask argument carries their tree ids (AllGatherAttention's tree attention).
    tree_ids = None if mb.tree_ids is None else mb.tree_ids.to(groups.device)
    return model(
        local.tokens.to(groups.device),
        local.position_ids.to(groups.device),
        tree_ids,
        packed_seq_params=packed_seq_params(mb, groups.device),
        **images,
    )


def run_schedule(
    model: torch.nn.Module,
    batch: TrainBatch,
    groups: ParallelGroups,
    loss_func: Callable[[MicroBatch, Tensor], tuple[Tensor, dict[str, Any]]],
    *,
    forward_only: bool,
    routing: RoutingReplay | None = None,
) -> list[dict[str, Any]]:
    """Megatron's forward(-backward) schedule over the batch; the per-micro-batch dicts (last stage)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler
    from megatron.core.utils import get_model_config

    # megatron keeps the MoE aux-loss gradient scale in a class global whose shape is whatever its
    # first setter used (a bare MoE backward makes it [], the schedule copies a [1] into it).
    MoEAuxLossAutoScaler.main_loss_backward_scale = None
    multiple = 2 * groups.cp_size if groups.cp_size > 1 else 1  # each CP rank holds 2 equal chunks of every span
    if get_model_config(model).sequence_parallel:
        # sequence parallelism splits each CP rank's share of a row over TP
        multiple = math.lcm(multiple, groups.tp_size * groups.cp_size)
    if multiple > 1:
        batch = batch.with_length_multiple(multiple)
    if groups.pp_size > 1:
        batch = batch.uniform()  # p2p transfers between stages assume one activation shape
    rows, length = batch.shape
    micro: Iterator[MicroBatch] = iter(batch.micro_batches)

    def forward_step(data_iterator: Iterator[MicroBatch], chunk: torch.nn.Module):
        mb = next(data_iterator)
        return model_forward(chunk, mb, groups, routing), lambda output: loss_func(mb, output)

    schedule = get_forward_backward_func(pp_size=groups.pp_size)
    extra = {}
    if groups.pp_size > 1:  # megatron wants the pipeline communicator whenever the groups are explicit
        extra["p2p_communicator"] = P2PCommunicator(pp_group=groups.pp, config=get_model_config(model))
    return schedule(
        forward_step_func=forward_step,
        data_iterator=micro,
        model=[model],
        num_microbatches=len(batch.micro_batches),
        seq_length=length,
        micro_batch_size=rows,
        forward_only=forward_only,
        pg_collection=groups.pg_collection,
        **extra,
    )


def broadcast_from_last_stage(values: Tensor | None, shape: tuple[int, ...], groups: ParallelGroups) -> Tensor:
    """The last pipeline stage's tensor on every stage (identity without PP)."""
    if groups.pp_size == 1:
        assert values is not None
        return values
    out = values if groups.is_last_stage else torch.empty(shape, dtype=torch.float32)
    dist.broadcast(out, src=dist.get_global_rank(groups.pp, groups.pp_size - 1), group=groups.pp)
    return out


def sample_values(output: Tensor, mb: MicroBatch, groups: ParallelGroups) -> Tensor:
    """Sample-space values ``[n, Tc]`` of a micro-batch from a value model's output ``[R, T, 1]``, 0 off the loss mask.

    The value of completion token ``j`` is the value head's output at the position that predicts
    it (where the policy's log-prob of that token is read): the state the token was chosen in.
    """
    values = output[..., 0].float()
    if groups.cp_size > 1:
        values = context_parallel.gather_sequence(
            values, groups.pg_collection.cp, dim=1, sum_grads=False, spans=mb.spans
        )
    return to_sample_space(values, mb) * mb.loss_mask.to(values.device)


@torch.no_grad()
def forward_sample_space(
    model: torch.nn.Module,
    batch: TrainBatch,
    groups: ParallelGroups,
    per_micro_batch: Callable[[MicroBatch, Tensor], dict[str, Tensor]],
    routing: RoutingReplay | None = None,
) -> dict[str, Tensor]:
    """Forward-only pass over the batch: the named sample-space tensors ``[N, Tc]`` of ``per_micro_batch``, on every
    stage.

    ``per_micro_batch(mb, output)`` maps the last stage's output for a micro-batch to its
    sample-space tensors; only the last pipeline stage runs it, then broadcasts the results.
    """

    def collect(mb: MicroBatch, output: Tensor) -> tuple[Tensor, dict[str, Any]]:
        return output.new_zeros(()), per_micro_batch(mb, output)

    was_training = model.training
    model.eval()
    try:
        stored = run_schedule(model, batch, groups, collect, forward_only=True, routing=routing)
    finally:
        model.train(was_training)
    shape = (batch.num_samples, batch.max_completion_len)
    keys = sorted(stored[0]) if groups.is_last_stage else None
    if groups.pp_size > 1:
        box = [keys]
        dist.broadcast_object_list(box, src=dist.get_global_rank(groups.pp, groups.pp_size - 1), group=groups.pp)
        keys = box[0]
    return {
        key: broadcast_from_last_stage(
            batch.scatter([d[key] for d in stored]) if groups.is_last_stage else None, shape, groups
        )
        for key in keys
    }


def forward_logprobs(
    model: torch.nn.Module,
    batch: TrainBatch,
    groups: ParallelGroups,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    routing: RoutingReplay | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Sample-space ``(logprobs, entropy or None)`` ``[N, Tc]`` of the batch's completion tokens (0 off-mask)."""

    def per_micro_batch(mb: MicroBatch, logits: Tensor) -> dict[str, Tensor]:
        lp, ent = sample_logprobs(logits, mb, groups, temperature=temperature, with_entropy=with_entropy)
        return {"logprobs": lp} if ent is None else {"logprobs": lp, "entropy": ent}

    out = forward_sample_space(model, batch, groups, per_micro_batch, routing)
    return out["logprobs"], out.get("entropy")


def forward_values(model: torch.nn.Module, batch: TrainBatch, groups: ParallelGroups) -> Tensor:
    """Sample-space values ``[N, Tc]`` of a value model (:class:`hetrl.trainer.model.ValueHead`) at the batch's
    completion tokens."""
    return forward_sample_space(model, batch, groups, lambda mb, output: {"values": sample_values(output, mb, groups)})[
        "values"
    ]
