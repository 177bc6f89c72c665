"""Trainer -> engine weight pushes: the contract every transport keeps.

A push is versioned and travels as a stream of size-bounded buckets of HF-named full tensors (what
the trainer's streaming exporter yields). The sender side lives in the trainer's rank 0; the
receiver side lives in the engine process. A receiver only ever *stages*: it returns a complete
:class:`StagedWeights` or raises :class:`WeightSyncError`, and the engine applies staged weights
in one step. So a push that dies midway (exporter exception, lost sender, checksum mismatch,
missing tensors) costs the push, never the engine's current weights.
"""

from __future__ import annotations

import abc
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

Bucket = list[tuple[str, torch.Tensor]]


class WeightSyncError(RuntimeError):
    """A push that did not arrive whole; the engine keeps the weights it had.

    Raised plain, the push was refused after it was read to its end: the transport is in step
    and the next push can arrive, so the push may simply be sent again.
    """


class WeightStreamBroken(WeightSyncError):
    """The transport itself failed midway (a timeout, a lost peer, messages out of order): no
    further push can arrive over it."""


def tensor_checksum(tensor: torch.Tensor) -> int:
    """CRC32 of the tensor's raw bytes (dtype-agnostic, so bf16 works too).

    A byte checksum rather than a float sum: a flipped mantissa bit or a swapped pair of tensors of
    the same shape must change it.
    """
    data = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
    return zlib.crc32(data)


@dataclass(frozen=True)
class TensorMeta:
    """What a receiver needs to rebuild one tensor from raw bytes, and to check it."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "float32"
    checksum: int | None = None

    @property
    def num_bytes(self) -> int:
        return _dtype(self.dtype).itemsize * _numel(self.shape)

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor, with_checksum: bool) -> TensorMeta:
        return cls(
            name=name,
            shape=tuple(tensor.shape),
            dtype=str(tensor.dtype).removeprefix("torch."),
            checksum=tensor_checksum(tensor) if with_checksum else None,
        )


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise WeightSyncError(f"unknown tensor dtype {name!r} in a weight push")
    return dtype


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def pack_bucket(bucket: Bucket, with_checksum: bool) -> tuple[list[TensorMeta], torch.Tensor]:
    """One flat uint8 buffer holding every tensor of ``bucket`` back to back, plus their metadata.

    One buffer per bucket is what makes a bucket one collective call instead of one per tensor.
    """
    metas = [TensorMeta.of(name, tensor, with_checksum) for name, tensor in bucket]
    flats = [tensor.detach().contiguous().reshape(-1).view(torch.uint8) for _, tensor in bucket]
    buffer = torch.cat(flats) if flats else torch.empty(0, dtype=torch.uint8)
    return metas, buffer


def unpack_bucket(metas: list[TensorMeta], buffer: torch.Tensor) -> Bucket:
    """Inverse of :func:`pack_bucket`: zero-copy views into ``buffer``."""
    expected = sum(meta.num_bytes for meta in metas)
    if buffer.numel() != expected:
        raise WeightSyncError(f"bucket buffer holds {buffer.numel()} bytes, its metadata describes {expected}")
    tensors: Bucket = []
    offset = 0
    for meta in metas:
        chunk = buffer[offset : offset + meta.num_bytes]
        tensors.append((meta.name, chunk.view(_dtype(meta.dtype)).reshape(meta.shape)))
        offset += meta.num_bytes
    return tensors


def bucketize(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[Bucket]:
    """Group ``(name, tensor)`` pairs into buckets of at most ``bucket_bytes`` (a bigger tensor goes alone).

    The trainer's exporter yields buckets itself; this serves sources that are plain state dicts.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    bucket: Bucket = []
    size = 0
    for name, tensor in named_tensors:
        num_bytes = tensor.numel() * tensor.element_size()
        if bucket and size + num_bytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += num_bytes
    if bucket:
        yield bucket


@dataclass
class StagedWeights:
    """A complete push, held aside until the engine applies it."""

    version: int
    tensors: dict[str, torch.Tensor]
    sent: dict[str, TensorMeta] = field(default_factory=dict)  # the sender's metadata, checksums when verifying
    shared_dir: Path | None = None  # where the tensors are staged in shared memory, if they are (see shared_memory)

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def on_host(self) -> StagedWeights:
        """This push with its tensors in host memory (the same object's tensors where they already are).

        Tensors staged in shared memory are already there; the copy does not name their directory,
        which the engine removes once its workers loaded the push.
        """
        return StagedWeights(self.version, {name: t.cpu() for name, t in self.tensors.items()}, dict(self.sent))

    def add(self, bucket: Bucket, metas: list[TensorMeta]) -> None:
        for (name, tensor), meta in zip(bucket, metas, strict=True):
            if name in self.tensors:
                raise WeightSyncError(f"push v{self.version}: tensor {name!r} sent twice")
            self.tensors[name] = tensor
            self.sent[name] = meta

    def verify_checksums(self) -> None:
        """Raise unless every tensor that came with a checksum still has it."""
        bad = [
            name
            for name, meta in self.sent.items()
            if meta.checksum is not None and tensor_checksum(self.tensors[name]) != meta.checksum
        ]
        if bad:
            raise WeightSyncError(f"push v{self.version}: checksum mismatch in {len(bad)} tensor(s), e.g. {bad[:3]}")

    def check_complete(self, expected: Mapping[str, tuple[tuple[int, ...], str]]) -> None:
        """Raise unless the push holds exactly the ``expected`` names with their shapes and dtypes.

        ``expected`` maps HF name -> (shape, dtype name), as read from the engine's checkpoint.
        The dtype may differ (the engine casts), the shape may not.
        """
        missing = sorted(set(expected) - set(self.tensors))
        unknown = sorted(set(self.tensors) - set(expected))
        wrong = [
            f"{name}: {tuple(self.tensors[name].shape)} != {tuple(shape)}"
            for name, (shape, _) in expected.items()
            if name in self.tensors and tuple(self.tensors[name].shape) != tuple(shape)
        ]
        problems = []
        if missing:
            problems.append(f"{len(missing)} missing (e.g. {missing[:3]})")
        if unknown:
            problems.append(f"{len(unknown)} unknown (e.g. {unknown[:3]})")
        if wrong:
            problems.append(f"{len(wrong)} with wrong shapes (e.g. {wrong[:3]})")
        if problems:
            raise WeightSyncError(f"push v{self.version} is incomplete: " + "; ".join(problems))


class WeightSender(abc.ABC):
    """Trainer side (rank 0): pushes one version to every engine."""

    @abc.abstractmethod
    def send(self, buckets: Iterable[Bucket], version: int, attempt: int = 0) -> int:
        """Stream ``buckets`` as push ``version``; return the bytes sent.

        ``attempt`` counts the sends of one version (0 first, 1 and up when an engine refused it);
        a transport whose receivers cannot tell sends apart by their order records it.
        If ``buckets`` raises midway, tell the receivers the push is void, then re-raise.
        """

    def close(self) -> None:
        """Release the transport's resources (no-op by default)."""


class WeightReceiver(abc.ABC):
    """Engine side: receives one whole push into memory, never into the live model."""

    @abc.abstractmethod
    def receive(self, version: int | None = None, attempt: int = 0) -> StagedWeights:
        """Block until the next push (of ``version``, its ``attempt``-th send or a later one, when
        given) is complete; raise :class:`WeightSyncError` if it is not."""

    def close(self) -> None:
        """Release the transport's resources (no-op by default)."""
