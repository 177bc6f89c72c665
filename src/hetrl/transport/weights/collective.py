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
    WeightStreamBroken,
    WeightSyncError,
    pack_bucket,
    unpack_bucket,
)
from hetrl.transport.weights.shared_memory import SharedMemoryPush

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


def send_message(
    group: WeightSyncGroup, kind: int, meta: dict | None = None, payload: torch.Tensor | None = None
) -> None:
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

    def send(self, buckets: Iterable[Bucket], version: int, attempt: int = 0) -> int:
        """The group's message order tells sends apart: ``attempt`` is not sent.

        A source that raises, or a bucket that cannot be packed, voids the push (ABORT) so that
        the engines stop waiting for it.
        """
        num_bytes = 0
        iterator = iter(buckets)
        while True:
            try:
                bucket = next(iterator, None)
                packed = None if bucket is None else pack_bucket(bucket, with_checksum=self.verify)
            except BaseException:
                send_message(self.group, ABORT, {"version": version})
                raise
            if packed is None:
                break
            num_bytes += self._send_bucket(*packed, version)
        self._send(END, {"version": version})
        return num_bytes

    def _send_bucket(self, metas: list[TensorMeta], payload: torch.Tensor, version: int) -> int:
        """Send one packed bucket; the number of payload bytes."""
        meta = {"version": version, "tensors": [asdict(m) for m in metas]}
        self._send(BUCKET, meta, payload.to(self.group.device))
        return payload.numel()

    def _send(self, kind: int, meta: dict, payload: torch.Tensor | None = None) -> None:
        """One message of a push; a transport failure (a timeout, a lost engine) is :class:`WeightStreamBroken`."""
        try:
            send_message(self.group, kind, meta, payload)
        except RuntimeError as error:  # gloo and NCCL raise plain RuntimeErrors
            raise WeightStreamBroken(f"weight push v{meta['version']} broke off: {error}") from error


class CollectiveWeightReceiver(WeightReceiver):
    """Engine rank: stages every bucket of one push, returns it only once END arrives.

    With ``shared_memory``, each bucket is staged as it arrives in a file of ``/dev/shm`` (see
    :mod:`hetrl.transport.weights.shared_memory`), for an engine with TP workers of their own: they
    map the push from there, and a whole staged copy would not fit beside the engine's shard on its
    first GPU anyway. Otherwise the push stays where its payloads arrive.
    """

    def __init__(self, group: WeightSyncGroup, verify: bool = False, shared_memory: bool = False) -> None:
        if group.rank == 0:
            raise ValueError("rank 0 of the weight-sync group is the trainer's sender, not an engine")
        self.group = group
        self.verify = verify
        self.shared_memory = shared_memory

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

    def receive(self, version: int | None = None, attempt: int = 0) -> StagedWeights:
        """The next whole push (of ``version``, when given; the group's order makes it the
        ``attempt`` asked for). One whose content is bad (a tensor sent twice, a bucket its metadata
        does not describe, a checksum mismatch, no room to stage it) is still read to its END, so
        that the group stays in step for the next push, and only then refused with
        :class:`WeightSyncError`."""
        staged: StagedWeights | None = None
        shared: SharedMemoryPush | None = None
        problem: WeightSyncError | None = None
        try:
            while True:
                kind, meta, payload = self._next_message(
                    staged.version if staged else version, len(staged.tensors) if staged else 0
                )
                if kind == ABORT:
                    raise WeightSyncError(
                        f"the sender voided push v{meta.get('version')} midway (its weight source raised)"
                    )
                staged = staged or StagedWeights(version=int(meta["version"]), tensors={})
                if kind == END:
                    break
                try:
                    buffer = self._bucket_buffer(meta, payload)
                    if problem is None:
                        if self.shared_memory and shared is None:
                            shared = SharedMemoryPush(staged.version)
                        metas = [
                            TensorMeta(m["name"], tuple(m["shape"]), m["dtype"], m["checksum"]) for m in meta["tensors"]
                        ]
                        staged.add(unpack_bucket(metas, shared.add_bucket(metas, buffer) if shared else buffer), metas)
                except WeightStreamBroken:
                    raise
                except WeightSyncError as error:  # read on to END, staging nothing more
                    problem = problem or error
            if problem is not None:
                raise problem
            if self.verify:
                staged.verify_checksums()
            staged.shared_dir = shared.finish() if shared else None
        except BaseException:
            if shared is not None:
                shared.remove()
            raise
        return staged

    def _next_message(self, version: int | None, received: int) -> tuple[int, dict, torch.Tensor | None]:
        """The next message of push ``version`` (any push when None), ``received`` tensors into it;
        raise :class:`WeightStreamBroken` if the transport failed or the sender is out of step."""
        try:
            kind, meta, payload = self._receive_message()
        except RuntimeError as error:  # gloo/NCCL timeouts and lost peers surface as RuntimeError
            raise WeightStreamBroken(f"weight push v{version} broke off after {received} tensors: {error}") from error
        if kind not in (BUCKET, END, ABORT):
            raise WeightStreamBroken(f"unknown weight-sync message kind {kind}")
        if version is not None and int(meta.get("version", -1)) != version:
            raise WeightStreamBroken(f"expected a message of weight push v{version}, got one of v{meta.get('version')}")
        return kind, meta, payload

    def _bucket_buffer(self, meta: dict, payload: torch.Tensor | None) -> torch.Tensor:
        """The flat bytes of one bucket (overridden by transports that pass the payload by handle)."""
        return payload if payload is not None else torch.empty(0, dtype=torch.uint8)
