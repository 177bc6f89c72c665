"""Rollout routing replay (R3): the trainer's MoE routers take the experts the engine routed each token to.

Why: the engine and the trainer compute the same MoE with different kernels, precisions and batch
shapes, so for some tokens their routers pick different experts; each such token's log-prob then
comes from a different sparse network than the one that sampled it, and that mismatch compounds
with staleness in off-policy runs. Replaying the engine's choice makes both compute the same
network; the router still gets gradients through the gate scores of the replayed experts
(``scores.gather(replayed)``, as megatron's own ``RouterReplay`` does).

How: megatron's top-k routing asks ``router.router_replay.get_replay_topk(...)`` for its top-k when
a router has a ``router_replay`` object (``topk_routing_with_score_function``). :class:`RoutingReplay`
puts one :class:`_LayerReplay` on every ``TopKRouter`` of a model chunk (no class-global state,
unlike megatron's ``RouterReplay`` list, so a reference model in the same process is unaffected).
Before each micro-batch's forward, :meth:`RoutingReplay.load` lays the micro-batch's routing
(``MicroBatch.routed_experts``, model space ``[R, T, layers, top_k]``, -1 where the engine routed
nothing: padding and each sample's last token) out as the routers see their tokens: CP ranks take
their positions (``shard_micro_batch`` does that with the tokens), megatron's ``[s, b]`` order is
sequence-major, and under sequence parallelism each TP rank routes its own contiguous share of
``s``. A pipeline stage's routers are those of its layers (``layer_number``); rows without engine
routing are routed to experts ``0..top_k-1``: their outputs feed nothing a loss reads.

Whether replaying or not, the routers also compute their own choice, and the forwards marked with
:meth:`RoutingReplay.measuring` count the (token, layer) pairs whose computed expert set differs
from the engine's: ``routing/disagree_frac``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import Tensor

from hetrl.trainer.batch import MicroBatch
from hetrl.trainer.parallel import ParallelGroups

TopK = Callable[..., tuple[Tensor, Tensor]]


class _LayerReplay:
    """What one router asks for its top-k (megatron's ``router_replay`` interface)."""

    def __init__(self, owner: RoutingReplay, layer: int) -> None:
        self.owner, self.layer = owner, layer

    def get_replay_topk(
        self,
        scores: Tensor,
        topk: int,
        num_groups: int | None = None,
        group_topk: int | None = None,
        default_compute_topk: TopK | None = None,
    ) -> tuple[Tensor, Tensor]:
        assert default_compute_topk is not None
        values, computed = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        owner = self.owner
        if owner.targets is None:  # no sample carried routing: warm-start demonstrations, no engine sampled them
            return values, computed
        target = owner.targets[:, self.layer].to(scores.device)
        if target.shape[0] != scores.shape[0]:
            raise RuntimeError(
                f"routing replay: layer {self.layer} routes {scores.shape[0]} tokens, the engine's routing has "
                f"{target.shape[0]} rows for them"
            )
        if owner.is_measuring:
            differs = (computed.sort(-1).values != target.sort(-1).values).any(-1) & owner.valid.to(scores.device)
            owner.disagree += (
                differs.sum().cpu()
            )  # the counters live on the host (a CPU scalar cannot take a CUDA one in place)
            owner.counted += owner.valid.sum()
        if not owner.replay:
            return values, computed
        return scores.gather(1, target), target


class RoutingReplay:
    """The engine's routing, replayed (``replay=True``) or only compared with, on one model chunk's routers."""

    def __init__(self, model: torch.nn.Module, groups: ParallelGroups, *, replay: bool, num_layers: int) -> None:
        from megatron.core.transformer.moe.router import TopKRouter

        self.groups, self.replay, self.num_layers = groups, replay, num_layers
        routers = [m for m in model.modules() if isinstance(m, TopKRouter)]
        if not routers:
            raise ValueError("routing replay needs an MoE model: this one has no router")
        for router in routers:
            router.router_replay = _LayerReplay(self, router.layer_number - 1)  # engine rows hold every layer, 0-based
        self.sequence_parallel = routers[0].config.sequence_parallel
        self.targets: Tensor | None = None  # [tokens this rank routes, layers, top_k] long
        self.valid = torch.zeros(0, dtype=torch.bool)
        self.is_measuring = False
        self.disagree = torch.zeros((), dtype=torch.long)
        self.counted = torch.zeros((), dtype=torch.long)

    def load(self, local: MicroBatch) -> None:
        """The routing of this rank's slice of a micro-batch (after ``shard_micro_batch``), in router order."""
        rows = local.routed_experts
        if rows is None:
            self.targets = None
            return
        if rows.shape[2] != self.num_layers:
            raise ValueError(
                f"routing replay: the samples carry routing for {rows.shape[2]} MoE layers, the model has "
                f"{self.num_layers}"
            )
        rows = rows.transpose(0, 1)  # [s, b, layers, k]: megatron's sequence-major token order
        if self.sequence_parallel and self.groups.tp_size > 1:
            share = rows.shape[0] // self.groups.tp_size
            rows = rows[self.groups.tp_rank * share : (self.groups.tp_rank + 1) * share]
        flat = rows.reshape(-1, *rows.shape[2:])
        self.valid = flat[:, 0, 0] >= 0
        default = torch.arange(flat.shape[-1]).expand_as(flat)
        self.targets = torch.where(flat >= 0, flat, default).long()

    @contextmanager
    def measuring(self) -> Iterator[None]:
        """Count routing disagreement in the forwards inside (those of the weights the engine sampled with)."""
        self.is_measuring = True
        try:
            yield
        finally:
            self.is_measuring = False

    def take_disagreement(self) -> float | None:
        """Fraction of (token, layer) pairs measured since the last call whose computed experts differ from the
        engine's.

        A collective over the trainer's ranks (each routes its own tokens and layers); None when nothing was measured.
        """
        counts = torch.stack([self.disagree, self.counted]).double()
        dist.all_reduce(counts)
        self.disagree.zero_()
        self.counted.zero_()
        return float(counts[0] / counts[1]) if counts[1] > 0 else None
