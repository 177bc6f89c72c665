"""Turn a list of :class:`hetrl.records.Sample` into the trainer's micro-batches.

Two spaces, kept apart on purpose:

* **model space** — what the network eats: rows of token ids ``[R, T]``, one sample per row, right
  padded; or, packed, every sample of the micro-batch one after the other in a single row ``[1, t]``
  (megatron's THD layout: ``cu_seqlens`` mark where each sample starts, attention stays inside a
  sample, position ids restart per sample); or, with shared prompts, every GRPO group of the
  micro-batch one after the other in a single row, each its prompt followed by each of its
  completions as a branch (``tree_ids``, :mod:`hetrl.trainer.shared_prompts`); plus the
  next-token ``labels``;
* **sample space** — what the loss eats: one row per sample and one column per *completion*
  token ``[n, Tc]``, exactly the layout of ``Sample.loss_mask`` / ``Sample.logprobs`` and of
  ``hetrl.trainer.algorithms.compute_advantages``'s output.

Micro-batches are built with zero advantages (all that log-prob and value passes need); the
advantages of a training step are attached afterwards, over the step's full batch, with
:meth:`TrainBatch.with_advantages`.

``MicroBatch.gather_index`` maps one to the other: the log-prob of completion token ``j`` of a
sample starting at offset ``o`` of row ``r`` with a prompt of ``P`` tokens is read at flat position
``r * T + o + P + j - 1`` of the model's per-position log-probs (position ``t`` predicts token
``t + 1``). For a vision-language policy, model space holds every image placeholder
``tokens_per_image`` times (``hetrl.trainer.vision``), so ``P + j`` becomes the model position of
completion token ``j``; sample space keeps one column per completion token all the same. In a
shared-prompt row, completion token ``j`` of the branch starting at offset ``o`` is read at ``o + j``
(the branch starts with its own copy of the prompt's last token). So neither packing nor shared
prompts leak into the loss: sequence-level losses (GSPO, seq-mean) see whole sequences whatever the
layout.

Micro-batches are balanced by tokens (longest-processing-time-first assignment), and every rank
can be made to run the same number of them (:meth:`TrainBatch.padded_to`), which expert-parallel
all-to-alls and pipeline schedules need.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from hetrl.records import Sample
from hetrl.trainer.shards import balanced_bins
from hetrl.trainer.shared_prompts import PAD_BRANCH, prompt_groups, tree_length
from hetrl.trainer.vision import ImageSpec, model_length, model_tokens, pixel_values

PAD_TOKEN_ID = 0  # masked everywhere it appears; right padding under a causal mask changes nothing


def spans_from_bounds(bounds: Tensor) -> list[tuple[int, int]]:
    """``(start, length)`` of each span from cumulative bounds ``[0, e1, e2, ...]`` (a ``cu_seqlens``)."""
    edges = bounds.tolist()
    return [(start, end - start) for start, end in zip(edges[:-1], edges[1:])]


@dataclass
class MicroBatch:
    """One forward/backward pass: model-space inputs and sample-space targets."""

    tokens: Tensor  # [R, T] long
    position_ids: Tensor  # [R, T] long
    labels: Tensor  # [R, T] long, tokens shifted left by one (PAD past the end of a row)
    # Packed (THD) micro-batches only, int32 [n + 1]: cumulative real lengths of the samples, and
    # where each one's span starts in the row (spans may end in padding, see with_length_multiple).
    cu_seqlens: Tensor | None
    cu_seqlens_padded: Tensor | None
    gather_index: Tensor  # [n, Tc] long, flat index into [R * T] per-position log-probs
    loss_mask: Tensor  # [n, Tc] float, 1 for policy tokens
    rollout_logprobs: Tensor  # [n, Tc] float, engine log-probs (0 off-mask)
    advantages: Tensor  # [n, Tc] float
    sample_indices: list[int]  # positions of the n samples in the TrainBatch (empty for a filler)
    num_tokens: int  # real (non-pad) tokens in the rows
    # Routing replay (MoE): the engine's experts per token, [R, T, layers, top_k] long in model
    # space, -1 where it routed nothing (padding, each sample's last token); None without routing.
    routed_experts: Tensor | None = None
    # Vision-language policies (hetrl.trainer.vision): the pixel values [I, 3, S, S] of the images of
    # the rows, and the bool [R, T] mask of the positions their embeddings take (row-major order,
    # tokens_per_image each); None without images.
    pixel_values: Tensor | None = None
    image_mask: Tensor | None = None
    # Shared prompts (hetrl.trainer.shared_prompts): [2, R, T] long, the tree (a group's prompt and its
    # completions) of each position and its branch in it (0 the prompt, k the k-th completion);
    # PAD_BRANCH in both on padding. The attention follows them. None: causal rows.
    tree_ids: Tensor | None = None

    @property
    def num_samples(self) -> int:
        return len(self.sample_indices)

    @property
    def spans(self) -> list[tuple[int, int]]:
        """``(start, length)`` of each attention span of a row: the packed samples, or the whole row."""
        if self.cu_seqlens_padded is None:
            return [(0, self.tokens.shape[1])]
        return spans_from_bounds(self.cu_seqlens_padded)


@dataclass
class TrainBatch:
    """The micro-batches of one rank for one optimizer step (or one log-prob pass)."""

    micro_batches: list[MicroBatch]
    num_samples: int
    max_completion_len: int
    # Position of each of this rank's samples in the step's full (all data-parallel ranks) batch.
    global_indices: list[int]
    num_global_samples: int

    @property
    def num_tokens(self) -> int:
        return sum(mb.num_tokens for mb in self.micro_batches)

    @property
    def shape(self) -> tuple[int, int]:
        """The largest ``(rows, tokens)`` of any micro-batch."""
        return (
            max(mb.tokens.shape[0] for mb in self.micro_batches),
            max(mb.tokens.shape[1] for mb in self.micro_batches),
        )

    def padded_to(self, num_micro_batches: int) -> TrainBatch:
        """The same batch with filler micro-batches (no policy tokens) appended up to the count."""
        missing = num_micro_batches - len(self.micro_batches)
        if missing < 0:
            raise ValueError(f"batch has {len(self.micro_batches)} micro-batches, more than {num_micro_batches}")
        template = self.micro_batches[0]
        return replace(self, micro_batches=self.micro_batches + [_filler(template) for _ in range(missing)])

    def uniform(self) -> TrainBatch:
        """Every micro-batch padded to the same ``[R, T]`` (pipeline p2p transfers need one shape)."""
        rows, length = self.shape
        return replace(self, micro_batches=[_pad_rows(mb, rows, length) for mb in self.micro_batches])

    def with_length_multiple(self, multiple: int) -> TrainBatch:
        """Every attention span a multiple of ``multiple`` tokens (context-parallel slicing).

        Rows are right-padded; packed samples each get their own padding, so that every CP rank
        holds its share of every sample (what transformer-engine's THD context parallelism needs).
        """

        def pad(mb: MicroBatch) -> MicroBatch:
            if mb.cu_seqlens_padded is not None:
                return _pad_spans(mb, multiple)
            rows, length = mb.tokens.shape
            return _pad_rows(mb, rows, -(-length // multiple) * multiple)

        return replace(self, micro_batches=[pad(mb) for mb in self.micro_batches])

    def with_advantages(self, advantages: Tensor) -> TrainBatch:
        """The same batch carrying the advantages of the step's full batch, masked by each loss mask.

        ``advantages`` are ``[num_global_samples]`` (one per sample, broadcast over its completion
        tokens) or per-token ``[num_global_samples, Tc]`` in sample space (computed on the trainer
        once every rank has the full batch's log-probs and values); this rank keeps its own rows.
        """
        local = _advantage_rows(advantages, self.num_global_samples, self.max_completion_len)[self.global_indices]
        return replace(
            self,
            micro_batches=[replace(mb, advantages=self.gather(local, mb) * mb.loss_mask) for mb in self.micro_batches],
        )

    def scatter(self, per_micro_batch: Sequence[Tensor]) -> Tensor:
        """Sample-space tensors of each micro-batch ``[n, Tc_mb]`` -> one ``[N, Tc]`` in batch order."""
        out = torch.zeros(self.num_samples, self.max_completion_len, dtype=torch.float32)
        for mb, values in zip(self.micro_batches, per_micro_batch):
            if mb.sample_indices:
                out[mb.sample_indices, : values.shape[1]] = values.detach().float().cpu()
        return out

    def gather(self, values: Tensor, mb: MicroBatch) -> Tensor:
        """The rows of a batch-order ``[N, Tc]`` tensor that belong to ``mb``, as ``[n, Tc_mb]``."""
        if not mb.sample_indices:
            return torch.zeros_like(mb.loss_mask)
        return values[mb.sample_indices, : mb.loss_mask.shape[1]].to(mb.loss_mask.device)


def _advantage_rows(advantages: Tensor, num_samples: int, width: int) -> Tensor:
    """Per-token advantages ``[N, width]``: an ``[N]`` sequence advantage is broadcast over tokens."""
    adv = advantages.float()
    if adv.dim() not in (1, 2) or adv.shape[0] != num_samples:
        raise ValueError(
            f"advantages must be [N] or [N, Tc] with N={num_samples} samples, got shape {tuple(adv.shape)}"
        )
    if adv.dim() == 1:
        return adv[:, None].expand(num_samples, width)
    if adv.shape[1] < width:
        adv = torch.nn.functional.pad(adv, (0, width - adv.shape[1]))
    return adv[:, :width]


def _pack_rows(lengths: Sequence[int], pack_length: int) -> list[list[int]]:
    """First-fit-decreasing packing of sequences into rows of at most ``pack_length`` tokens."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        if lengths[i] > pack_length:
            raise ValueError(f"a sample of {lengths[i]} tokens does not fit trainer pack_length={pack_length}")
        slot = next((r for r, free in enumerate(room) if free >= lengths[i]), None)
        if slot is None:
            rows.append([i])
            room.append(pack_length - lengths[i])
        else:
            rows[slot].append(i)
            room[slot] -= lengths[i]
    return rows


def _cumulative(lengths: Sequence[int]) -> Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)


def _build_micro_batch(
    samples: Sequence[Sample], indices: list[int], rows: list[list[int]], packed: bool, images: ImageSpec | None
) -> MicroBatch:
    """Lay out the samples ``rows`` (local positions into ``indices``) as one micro-batch.

    Unpacked, each row holds one sample; packed, the rows' samples follow each other in one row.
    Image placeholders take ``images.tokens_per_image`` positions each (:func:`hetrl.trainer.vision.model_tokens`).
    """
    if packed:
        rows = [[k for row in rows for k in row]]
    seqs = [samples[indices[k]] for row in rows for k in row]
    length = max(sum(model_length(samples[indices[k]], images) for k in row) for row in rows)
    width = max(max((len(s.completion_ids) for s in seqs), default=0), 1)
    num_rows, n = len(rows), len(seqs)
    tokens = torch.full((num_rows, length), PAD_TOKEN_ID, dtype=torch.long)
    positions = torch.zeros_like(tokens)
    gather = torch.zeros(n, width, dtype=torch.long)
    loss_mask, rollout = torch.zeros(n, width), torch.zeros(n, width)
    routed = _routing_layout(seqs, num_rows, length)
    if routed is not None and images is not None:
        raise ValueError("routing replay and images do not mix (a LLaVA policy is dense)")
    image_mask = torch.zeros(num_rows, length, dtype=torch.bool) if images is not None else None
    row_images: list = []
    order: list[int] = []
    for r, row in enumerate(rows):
        offset = 0
        for k in row:
            i = len(order)
            s = samples[indices[k]]
            if not s.prompt_ids:
                raise ValueError(
                    f"sample {s.sample_id} has an empty prompt: its first token has nothing to condition on"
                )
            layout = model_tokens(s, images)
            ids, c = layout.ids, len(s.completion_ids)
            tokens[r, offset : offset + len(ids)] = torch.tensor(ids, dtype=torch.long)
            positions[r, offset : offset + len(ids)] = torch.arange(len(ids))
            # each original completion token is read where the model predicts it (one position before it)
            gather[i, :c] = r * length + offset - 1 + torch.tensor(layout.completion_at, dtype=torch.long)
            if layout.image_positions:
                image_mask[r, offset + torch.tensor(layout.image_positions)] = True
                row_images.extend(s.images)
            loss_mask[i, :c] = torch.tensor(s.loss_mask, dtype=torch.float32)
            rollout[i, :c] = torch.tensor(s.logprobs, dtype=torch.float32)
            if routed is not None and s.routed_experts is not None:
                routed[r, offset : offset + len(ids) - 1] = torch.from_numpy(s.routed_experts.astype("int64"))
            order.append(indices[k])
            offset += len(ids)
    lengths = [model_length(s, images) for s in seqs]
    cu = _cumulative(lengths) if packed else None
    with_images = images is not None and bool(row_images)
    return MicroBatch(
        tokens=tokens,
        position_ids=positions,
        labels=_shift_left(tokens),
        cu_seqlens=cu,
        cu_seqlens_padded=cu,
        gather_index=gather,
        loss_mask=loss_mask,
        rollout_logprobs=rollout * loss_mask,
        advantages=torch.zeros(n, width),
        sample_indices=order,
        num_tokens=sum(lengths),
        routed_experts=routed,
        pixel_values=pixel_values(row_images, images) if with_images else None,
        image_mask=image_mask if with_images else None,
    )


def _build_tree_micro_batch(samples: Sequence[Sample], indices: list[int], groups: list[list[int]]) -> MicroBatch:
    """Lay out ``groups`` (local positions into ``indices``, each the samples of one prompt) as shared-prompt
    trees, one after the other in a single row: no padding between them (rows of one tree each were padded
    to the longest, ~7% of a tiny_grpo step's positions)."""
    trees = [[samples[indices[k]] for k in group] for group in groups]
    seqs = [s for tree in trees for s in tree]
    if any(s.routed_experts is not None for s in seqs):
        raise ValueError("trainer.shared_prompts does not lay out engine routing (MoE routing replay)")
    length = sum(tree_length(tree) for tree in trees)
    width = max(max(len(s.completion_ids) for s in seqs), 1)
    n = len(seqs)
    tokens = torch.full((1, length), PAD_TOKEN_ID, dtype=torch.long)
    positions = torch.zeros_like(tokens)
    tree_ids = torch.full((2, 1, length), PAD_BRANCH, dtype=torch.long)
    gather = torch.zeros(n, width, dtype=torch.long)
    loss_mask, rollout = torch.zeros(n, width), torch.zeros(n, width)
    order: list[int] = []
    offset = 0
    for t, (group, tree) in enumerate(zip(groups, trees)):
        prompt = tree[0].prompt_ids
        if not prompt:
            raise ValueError(
                f"sample {tree[0].sample_id} has an empty prompt: its first token has nothing to condition on"
            )
        shared = len(prompt) - 1
        tokens[0, offset : offset + shared] = torch.tensor(prompt[:-1], dtype=torch.long)
        positions[0, offset : offset + shared] = torch.arange(shared)
        tree_ids[:, 0, offset : offset + shared] = torch.tensor([[t], [0]])
        offset += shared
        for branch, (k, s) in enumerate(zip(group, tree), start=1):
            ids, c = [prompt[-1], *s.completion_ids], len(s.completion_ids)
            tokens[0, offset : offset + len(ids)] = torch.tensor(ids, dtype=torch.long)
            positions[0, offset : offset + len(ids)] = shared + torch.arange(len(ids))
            tree_ids[:, 0, offset : offset + len(ids)] = torch.tensor([[t], [branch]])
            i = len(order)
            gather[i, :c] = offset + torch.arange(c)  # the branch's position j predicts its token j
            loss_mask[i, :c] = torch.tensor(s.loss_mask, dtype=torch.float32)
            rollout[i, :c] = torch.tensor(s.logprobs, dtype=torch.float32)
            order.append(indices[k])
            offset += len(ids)
    return MicroBatch(
        tokens=tokens,
        position_ids=positions,
        labels=_shift_left(tokens),
        cu_seqlens=None,
        cu_seqlens_padded=None,
        gather_index=gather,
        loss_mask=loss_mask,
        rollout_logprobs=rollout * loss_mask,
        advantages=torch.zeros(n, width),
        sample_indices=order,
        num_tokens=length,
        tree_ids=tree_ids,
    )


def _routing_layout(seqs: Sequence[Sample], rows: int, length: int) -> Tensor | None:
    """An all ``-1`` ``[rows, length, layers, top_k]`` routing tensor when any sample carries routing, else None.

    Routing is all or nothing: a sample with policy tokens but no routing would be trained under
    routing the engine never used.
    """
    shapes = {s.routed_experts.shape[1:] for s in seqs if s.routed_experts is not None}
    if not shapes:
        return None
    if len(shapes) > 1:
        raise ValueError(f"samples carry routing of different shapes (layers, top_k): {sorted(shapes)}")
    missing = [s.sample_id for s in seqs if s.routed_experts is None and any(s.loss_mask)]
    if missing:
        raise ValueError(
            f"routing replay: samples {missing[:3]} have policy tokens but no engine routing "
            "(were they generated with rollout.return_routing / routing_replay on?)"
        )
    return torch.full((rows, length, *shapes.pop()), -1, dtype=torch.long)


def _shift_left(tokens: Tensor) -> Tensor:
    """Next-token labels: position ``t`` predicts token ``t + 1`` (PAD past the end of a row)."""
    return torch.cat([tokens[:, 1:], torch.full((tokens.shape[0], 1), PAD_TOKEN_ID, dtype=torch.long)], dim=1)


def build_train_batch(
    samples: Sequence[Sample],
    *,
    micro_batch_size: int,
    pack_length: int | None = None,
    global_indices: Sequence[int] | None = None,
    num_global_samples: int | None = None,
    images: ImageSpec | None = None,
    shared_prompts: bool = False,
) -> TrainBatch:
    """Micro-batches of ``samples`` (this rank's share), balanced by tokens.

    Without ``pack_length`` each micro-batch holds up to ``micro_batch_size`` samples, one per row.
    With it, samples are first packed into bins of at most ``pack_length`` tokens, and each
    micro-batch holds up to ``micro_batch_size`` bins, laid out as one packed (THD) row. Advantages are zero (attach
    them with
    :meth:`TrainBatch.with_advantages`). ``global_indices`` places these samples in the step's full
    batch of ``num_global_samples`` (default: they are all of it). ``images`` (a vision-language
    policy's :func:`hetrl.trainer.vision.image_spec`) expands image placeholders in model space and
    gives micro-batches their pixel values; sample space stays one column per completion token.
    ``shared_prompts`` lays each group's samples (one prompt) out as one tree
    (:mod:`hetrl.trainer.shared_prompts`), a micro-batch's trees in one row; ``micro_batch_size`` then
    counts trees.
    """
    if not samples:
        raise ValueError("build_train_batch needs at least one sample")
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    if shared_prompts and (pack_length or images is not None):
        raise ValueError("shared prompts are laid out without packing and without images")
    width = max(max(len(s.completion_ids) for s in samples), 1)
    if shared_prompts:
        rows = prompt_groups(samples)
        row_sizes = [tree_length([samples[i] for i in row]) for row in rows]
    else:
        lengths = [model_length(s, images) for s in samples]
        rows = _pack_rows(lengths, pack_length) if pack_length else [[i] for i in range(len(samples))]
        row_sizes = [sum(lengths[i] for i in row) for row in rows]
    num_micro = -(-len(rows) // micro_batch_size)
    micro = []
    for row_ids in balanced_bins(row_sizes, num_micro, capacity=micro_batch_size):
        indices = [i for r in row_ids for i in rows[r]]
        local = {i: k for k, i in enumerate(indices)}
        local_rows = [[local[i] for i in rows[r]] for r in row_ids]
        micro.append(
            _build_tree_micro_batch(samples, indices, local_rows)
            if shared_prompts
            else _build_micro_batch(samples, indices, local_rows, bool(pack_length), images)
        )
    indices = list(range(len(samples))) if global_indices is None else list(global_indices)
    if len(indices) != len(samples):
        raise ValueError(f"global_indices has {len(indices)} entries for {len(samples)} samples")
    return TrainBatch(
        micro_batches=micro,
        num_samples=len(samples),
        max_completion_len=width,
        global_indices=indices,
        num_global_samples=len(samples) if num_global_samples is None else num_global_samples,
    )


def _filler(template: MicroBatch) -> MicroBatch:
    """A one-row, one-sample micro-batch with nothing to learn from (every mask 0)."""
    length = template.tokens.shape[1]
    tokens = torch.full((1, length), PAD_TOKEN_ID, dtype=torch.long)
    zeros = torch.zeros(1, 1)
    cu = None if template.cu_seqlens is None else _cumulative([length])
    return MicroBatch(
        tokens=tokens,
        position_ids=torch.zeros_like(tokens),
        labels=tokens.clone(),
        cu_seqlens=cu,
        cu_seqlens_padded=cu,
        gather_index=torch.zeros(1, 1, dtype=torch.long),
        loss_mask=zeros,
        rollout_logprobs=zeros.clone(),
        advantages=zeros.clone(),
        sample_indices=[],
        num_tokens=0,
        routed_experts=None
        if template.routed_experts is None
        else torch.full((1, length, *template.routed_experts.shape[2:]), -1),
    )


def _pad_rows(mb: MicroBatch, rows: int, length: int) -> MicroBatch:
    """``mb`` with pad rows/columns added to ``[rows, length]``; the gather index is re-based.

    A packed row grows by one more span of padding (its own "sample", which no loss reads).
    """
    r, t = mb.tokens.shape
    if (r, t) == (rows, length):
        return mb
    if mb.cu_seqlens is not None and rows != 1:
        raise ValueError(f"a packed micro-batch is one row; cannot pad it to {rows} rows")
    grow = (0, length - t, 0, rows - r)
    tokens = torch.nn.functional.pad(mb.tokens, grow, value=PAD_TOKEN_ID)
    cu, cu_padded = mb.cu_seqlens, mb.cu_seqlens_padded
    if cu is not None and length > t:
        cu = torch.cat([cu, cu[-1:] + (length - t)])
        cu_padded = torch.cat([cu_padded, torch.tensor([length], dtype=torch.int32)])
    gather = (mb.gather_index // t) * length + mb.gather_index % t
    routed = mb.routed_experts
    if routed is not None:
        routed = torch.nn.functional.pad(routed, (0, 0, 0, 0, 0, length - t, 0, rows - r), value=-1)
    image_mask = None if mb.image_mask is None else torch.nn.functional.pad(mb.image_mask, grow, value=False)
    tree_ids = None if mb.tree_ids is None else torch.nn.functional.pad(mb.tree_ids, grow, value=PAD_BRANCH)
    return replace(
        mb,
        tokens=tokens,
        routed_experts=routed,
        image_mask=image_mask,
        tree_ids=tree_ids,
        position_ids=torch.nn.functional.pad(mb.position_ids, grow),
        labels=torch.nn.functional.pad(mb.labels, grow, value=PAD_TOKEN_ID),
        cu_seqlens=cu,
        cu_seqlens_padded=cu_padded,
        gather_index=gather,
    )


def _pad_spans(mb: MicroBatch, multiple: int) -> MicroBatch:
    """A packed micro-batch with every sample's span padded to a multiple of ``multiple`` tokens.

    The real lengths (``cu_seqlens``) stay; the spans (``cu_seqlens_padded``) grow.
    """
    old = mb.spans
    lengths = [-(-span // multiple) * multiple for _, span in old]
    if lengths == [span for _, span in old]:
        return mb
    cu_padded = _cumulative(lengths)
    moved = torch.arange(mb.tokens.shape[1])  # old position -> new position
    for (start, span), new_start in zip(old, cu_padded.tolist()):
        moved[start : start + span] += new_start - start
    tokens = torch.full((1, int(cu_padded[-1])), PAD_TOKEN_ID, dtype=torch.long)
    tokens[0, moved] = mb.tokens[0]
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    routed = mb.routed_experts
    if routed is not None:
        routed = torch.full((1, tokens.shape[1], *routed.shape[2:]), -1, dtype=torch.long).index_copy_(1, moved, routed)
    image_mask = mb.image_mask
    if image_mask is not None:
        image_mask = torch.zeros(1, tokens.shape[1], dtype=torch.bool).index_copy_(1, moved, image_mask)
    return replace(
        mb,
        tokens=tokens,
        routed_experts=routed,
        image_mask=image_mask,
        position_ids=positions,
        labels=_shift_left(tokens),
        cu_seqlens_padded=cu_padded,
        gather_index=moved[mb.gather_index],
    )
