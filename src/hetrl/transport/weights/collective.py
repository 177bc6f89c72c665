"""Bucketed broadcast of a weight push over a process group of its own (gloo on CPU, NCCL on GPU).

The group spans the trainer's rank 0 (group rank 0, the root) and one rank per engine. It is built
straight from a ``TCPStore`` and never touches ``torch.distributed``'s default group: the trainer's
Megatron owns that one, over trainer ranks only.

Wire protocol, per message: an int64 header ``[kind, meta_len, payload_len]`` and, for a bucket,
a JSON metadata blob and one flat uint8 payload. Headers and metadata always go over gloo; the
payload goes over the data group (NCCL when the tensors live on GPUs). A push is any number of
BUCKET messages ended by END, or voided by ABORT when the sender's source raised midway.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from hetrl.transport.weights.base import (
    Bucket,
    StagedWeights,
    TensorMeta,
    WeightReceiver,
    WeightSender,
    WeightSyncError,
    pack_bucket,
    unpack_bucket,
)

BUCKET, END, ABORT = 1, 2, 3


@dataclass
class WeightSyncGroup:
    """The trainer-rank-0 + engines group, passed explicitly to senders and receivers."""

    rank: int
    world_size: int
    control: dist.ProcessGroup  # gloo: headers and metadata
    data: dist.ProcessGroup  # gloo or NCCL: bucket payloads
    device: torch.device  # where payloads live on this rank


def init_weight_sync_group(
    host: str,
    port: int,
    rank: int,
    world_size: int,
    backend: str = "gloo",
    timeout_s: float = 300.0,
    prefix: str = "hetrl-weights",
    device: torch.device | None = None,
) -> WeightSyncGroup:
    """Join the weight-sync group; rank 0 (the trainer) hosts the store. Every member calls this.

    ``prefix`` namespaces the store keys: rebuild the group under a new prefix after a push that
    timed out, since a gloo group that saw a timeout is not reusable.
    """
    if world_size < 2:
        raise ValueError(f"a weight-sync group needs the trainer and at least one engine, got world_size={world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside the weight-sync group of size {world_size}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"weight-sync backend must be 'gloo' or 'nccl', got {backend!r}")
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
    control = dist.ProcessGroupGloo(dist.PrefixStore(f"{prefix}/control", store), rank, world_size, timeout)
    if backend == "gloo":
        return WeightSyncGroup(rank, world_size, control, control, device or torch.device("cpu"))
    if not torch.cuda.is_available():
        raise RuntimeError("weight-sync backend 'nccl' needs a CUDA device; use 'gloo' on CPU")
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    data = dist.ProcessGroupNCCL(dist.PrefixStore(f"{prefix}/data", store), rank, world_size, options)
    return WeightSyncGroup(rank, world_size, control, data, device or torch.device("cuda", torch.cuda.current_device()))


def broadcast(group: dist.ProcessGroup, tensor: torch.Tensor) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()


def send_message(group: WeightSyncGroup, kind: int, meta: dict | None = None, payload: torch.Tensor | None = None) -> None:
    blob = json.dumps(meta).encode() if meta is not None else b""
    payload_len = payload.numel() if payload is not None else 0
    broadcast(group.control, torch.tensor([kind, len(blob), payload_len], dtype=torch.int64))
    if blob:
        broadcast(group.control, torch.frombuffer(bytearray(blob), dtype=torch.uint8))
    if payload_len:
        broadcast(group.data, payload)


class CollectiveWeightSender(WeightSender):
    """Trainer rank 0: broadcasts each bucket as one flat buffer."""

    def __init__(self, group: WeightSyncGroup, verify: bool = False) -> None:
        if group.rank != 0:
            raise ValueError(f"the sender must be rank 0 of the weight-sync group, not rank {group.rank}")
        self.group = group
        self.verify = verify

    def send(self, buckets: Iterable[Bucket], version: int) -> int:
        num_bytes = 0
        iterator = iter(buckets)
        while True:
            try:
                bucket = next(iterator, None)
            except BaseException:
                send_message(self.group, ABORT, {"version": version})
                raise
            if bucket is None:
                break
            num_bytes += self._send_bucket(bucket, version)
        send_message(self.group, END, {"version": version})
        return num_bytes

    def _send_bucket(self, bucket: Bucket, version: int) -> int:
        metas, payload = pack_bucket(bucket, with_checksum=self.verify)
        meta = {"version": version, "tensors": [asdict(m) for m in metas]}
        send_message(self.group, BUCKET, meta, payload.to(self.group.device))
        return payload.numel()


class CollectiveWeightReceiver(WeightReceiver):
    """Engine rank: stages every bucket of one push, returns it only once END arrives.

    ``stage_on`` (default: where payloads arrive) is where the staged push is kept: host memory
    for an engine whose model spans several GPUs, since a whole staged copy would not fit beside
    the engine's own shard on its first GPU; each bucket then leaves the GPU as it arrives.
    """

    def __init__(self, group: WeightSyncGroup, verify: bool = False, stage_on: torch.device | None = None) -> None:
        if group.rank == 0:
            raise ValueError("rank 0 of the weight-sync group is the trainer's sender, not an engine")
        self.group = group
        self.verify = verify
        self.stage_on = stage_on

    def _receive_message(self) -> tuple[int, dict, torch.Tensor | None]:
        header = torch.empty(3, dtype=torch.int64)
        broadcast(self.group.control, header)
        kind, meta_len, payload_len = (int(v) for v in header)
        meta: dict = {}
        if meta_len:
            blob = torch.empty(meta_len, dtype=torch.uint8)
            broadcast(self.group.control, blob)
            meta = json.loads(bytes(blob.numpy()))
        payload = None
        if payload_len:
            payload = torch.empty(payload_len, dtype=torch.uint8, device=self.group.device)
            broadcast(self.group.data, payload)
        return kind, meta, payload

    def receive(self) -> StagedWeights:
        staged: StagedWeights | None = None
        while True:
            try:
                kind, meta, payload = self._receive_message()
            except RuntimeError as error:  # gloo/NCCL timeouts and lost peers surface as RuntimeError
                raise WeightSyncError(f"weight push broke off after {len(staged.tensors) if staged else 0} tensors: {error}") from error
            version = int(meta.get("version", -1))
            if staged is not None and version != staged.version:
                raise WeightSyncError(f"push v{staged.version} interleaved with a message of v{version}")
            if kind == ABORT:
                raise WeightSyncError(f"the sender voided push v{version} midway (its weight source raised)")
            if kind == END:
                staged = staged or StagedWeights(version=version, tensors={})
                if self.verify:
                    staged.verify_checksums()
                return staged
            if kind != BUCKET:
                raise WeightSyncError(f"unknown weight-sync message kind {kind}")
            staged = staged or StagedWeights(version=version, tensors={})
            metas = [TensorMeta(m["name"], tuple(m["shape"]), m["dtype"], m["checksum"]) for m in meta["tensors"]]
            buffer = self._bucket_buffer(meta, payload)
            if self.stage_on is not None:
                buffer = buffer.to(self.stage_on)
            staged.add(unpack_bucket(metas, buffer), metas)

    def _bucket_buffer(self, meta: dict, payload: torch.Tensor | None) -> torch.Tensor:
        """The flat bytes of one bucket (overridden by transports that pass the payload by handle)."""
        return payload if payload is not None else torch.empty(0, dtype=torch.uint8)
