"""Weight pushes staged in shared memory, for engines whose TP workers are processes of their own.

vLLM runs one worker process per TP rank, and its RPC carries pickled arguments, not tensors. So a
push for such an engine is staged in files of ``/dev/shm`` (RAM): the receiver copies each bucket
into a file of its own as it arrives, the engine hands the workers the push's directory, and each
worker maps the files and keeps its shard. The push is held in RAM once and never serialised again.

Layout: a directory ``hetrl-push-<pid>-v<version>-<random>/`` with ``bucket_<i>.bin`` (a bucket's
flat bytes, as sent) and ``manifest.json`` (name, file, byte offset, dtype and shape of every
tensor), written last: a directory without it is incomplete. The engine removes the directory once
its workers loaded the push; the tensors it keeps to rebuild a failed engine stay mapped, and their
RAM is freed with them. The pid in the name lets the next engine sweep what a killed one left.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from hetrl.transport.weights.base import TensorMeta, WeightSyncError, bucketize, pack_bucket

MANIFEST = "manifest.json"
PUSH_PREFIX = "hetrl-push-"
_WRITE_BUCKET_BYTES = 64 << 20  # pushes written out whole (not staged here) go in files of this size


def shared_memory_dir() -> Path:
    """``/dev/shm`` where it exists (RAM-backed on Linux), else the temporary directory."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


class SharedMemoryPush:
    """One push being staged in shared memory, bucket by bucket (the engine side)."""

    def __init__(self, version: int) -> None:
        self.version = version
        try:
            self.path = Path(
                tempfile.mkdtemp(prefix=f"{PUSH_PREFIX}{os.getpid()}-v{version}-", dir=shared_memory_dir())
            )
        except OSError as error:
            raise WeightSyncError(
                f"could not stage weight push v{version} in {shared_memory_dir()}: {error}"
            ) from error
        self._entries: list[dict] = []
        self._files = 0

    def add_bucket(self, metas: list[TensorMeta], buffer: torch.Tensor) -> torch.Tensor:
        """Copy a bucket's flat bytes (host or GPU) into a new file of the push; return the mapped copy."""
        file_name = f"bucket_{self._files:05d}.bin"
        self._files += 1
        mapped = _new_mapped_file(self.path / file_name, buffer.numel())
        mapped.copy_(buffer)
        offset = 0
        for meta in metas:
            self._entries.append(
                {"name": meta.name, "file": file_name, "offset": offset, "dtype": meta.dtype, "shape": list(meta.shape)}
            )
            offset += meta.num_bytes
        return mapped

    def finish(self) -> Path:
        """Write the manifest, which makes the push complete; return its directory."""
        tmp = self.path / f".{MANIFEST}.tmp"
        try:
            tmp.write_text(json.dumps({"version": self.version, "tensors": self._entries}))
            os.replace(tmp, self.path / MANIFEST)
        except OSError as error:
            raise WeightSyncError(f"could not finish weight push v{self.version} in {self.path}: {error}") from error
        return self.path

    def remove(self) -> None:
        remove_push(self.path)


def _new_mapped_file(path: Path, num_bytes: int) -> torch.Tensor:
    """A uint8 tensor mapped from a new file of ``num_bytes``, its RAM reserved up front.

    A sparse tmpfs file that runs out of room kills the process with SIGBUS when a page is first
    touched; ``posix_fallocate`` fails with ENOSPC instead, which refuses the push.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as error:
        raise WeightSyncError(f"could not create {path} for a weight push: {error}") from error
    try:
        if num_bytes:
            os.posix_fallocate(fd, 0, num_bytes)
    except OSError as error:
        raise WeightSyncError(
            f"{path.parent.parent} has no room for {num_bytes >> 20} MiB more of a weight push ({error}); "
            "enlarge it (e.g. docker --shm-size) or run the engine with fewer TP workers"
        ) from error
    finally:
        os.close(fd)
    if not num_bytes:
        return torch.empty(0, dtype=torch.uint8)
    return torch.from_file(str(path), shared=True, size=num_bytes, dtype=torch.uint8)


def write_push(tensors: Mapping[str, torch.Tensor], version: int) -> Path:
    """Write out a push that was not staged in shared memory (e.g. the one kept to rebuild an engine)."""
    push = SharedMemoryPush(version)
    try:
        for bucket in bucketize(tensors.items(), _WRITE_BUCKET_BYTES):
            metas, buffer = pack_bucket(bucket, with_checksum=False)
            push.add_bucket(metas, buffer)
        return push.finish()
    except BaseException:
        push.remove()
        raise


def read_push(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the push at ``path``, as views of its files mapped copy-on-write (the worker side)."""
    path = Path(path)
    manifest = json.loads((path / MANIFEST).read_text())
    mapped: dict[str, torch.Tensor] = {}
    for entry in manifest["tensors"]:
        file_name = entry["file"]
        if file_name not in mapped:
            size = (path / file_name).stat().st_size
            mapped[file_name] = torch.from_file(str(path / file_name), shared=False, size=size, dtype=torch.uint8)
        meta = TensorMeta(entry["name"], tuple(entry["shape"]), entry["dtype"])
        start = entry["offset"]
        data = mapped[file_name][start : start + meta.num_bytes]
        if data.numel() != meta.num_bytes:
            raise WeightSyncError(
                f"{path / file_name} holds {mapped[file_name].numel()} bytes, too few for {meta.name} at offset {start}"
            )
        yield meta.name, data.view(getattr(torch, meta.dtype)).reshape(meta.shape)


def remove_push(path: Path) -> None:
    """Remove a push directory; tensors mapped from it stay valid (their RAM goes when they do)."""
    shutil.rmtree(path, ignore_errors=True)


def sweep_stale_pushes() -> int:
    """Remove pushes whose engine process is gone (a SIGKILL skips every cleanup); returns how many."""
    removed = 0
    for path in shared_memory_dir().glob(f"{PUSH_PREFIX}*-v*"):
        pid = path.name.removeprefix(PUSH_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True
