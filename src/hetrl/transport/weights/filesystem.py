"""Weight pushes through a shared directory: the fallback when engines and trainer share no network group.

Layout under ``root``: one directory per version, ``v00000042/`` with ``bucket_00000.safetensors``
... and ``manifest.json`` (every tensor's name, file, shape, dtype and checksum when verifying),
plus a ``LATEST`` file naming the newest complete version. The sender writes a version under a
temporary name and renames it into place, then replaces ``LATEST`` by rename: a reader sees a
whole version or none, never a half-written one (rename is atomic on POSIX filesystems, including
Lustre/GPFS within one directory). A version sent again (an engine refused it) replaces the one on
disk the same way, and its manifest carries the send's ``attempt``: an engine asked for attempt 1
waits for it instead of reading the copy it refused. An engine still reading the old copy when it
is replaced fails that read and refuses the push, which is then sent once more: the bytes are the
same, so nothing wrong is ever served.

A new sender clears what an earlier one left under ``root``: after a restart from a checkpoint,
version numbers are reused for new weights, and an engine must not take a stale directory of the
same number for the push it waits for.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

from hetrl.transport.weights.base import (
    Bucket,
    StagedWeights,
    TensorMeta,
    WeightReceiver,
    WeightSender,
    WeightStreamBroken,
    WeightSyncError,
)

MANIFEST = "manifest.json"
LATEST = "LATEST"
VERSION_GLOB = "v" + "[0-9]" * 8  # the names version_dir gives


def version_dir(root: Path, version: int) -> Path:
    return Path(root) / f"v{version:08d}"


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


class FilesystemWeightSender(WeightSender):
    """Writes each push as safetensors files plus a manifest; keeps the newest ``keep`` versions."""

    def __init__(self, root: str | Path, verify: bool = False, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (the version engines load), got {keep}")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.verify = verify
        self.keep = keep
        for stale in self.root.glob(VERSION_GLOB):
            shutil.rmtree(stale, ignore_errors=True)
        (self.root / LATEST).unlink(missing_ok=True)

    def send(self, buckets: Iterable[Bucket], version: int, attempt: int = 0) -> int:
        from safetensors.torch import save_file

        final = version_dir(self.root, version)
        tmp = final.with_name(f".{final.name}.partial.{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        entries: list[dict] = []
        num_bytes = 0
        try:
            for index, bucket in enumerate(buckets):
                file_name = f"bucket_{index:05d}.safetensors"
                # clone(): safetensors refuses tensors that share storage (tied embeddings, views).
                save_file(
                    {name: tensor.detach().contiguous().cpu().clone() for name, tensor in bucket}, tmp / file_name
                )
                for name, tensor in bucket:
                    entries.append({"file": file_name, **asdict(TensorMeta.of(name, tensor, self.verify))})
                    num_bytes += tensor.numel() * tensor.element_size()
            (tmp / MANIFEST).write_text(json.dumps({"version": version, "attempt": attempt, "tensors": entries}))
            replaced = final.with_name(f".{final.name}.replaced.{os.getpid()}")
            if final.exists():  # sent again: move the old copy aside first, a directory rename cannot overwrite
                os.replace(final, replaced)
            os.replace(tmp, final)
            shutil.rmtree(replaced, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _atomic_write_text(self.root / LATEST, final.name)
        self._prune(version)
        return num_bytes

    def _prune(self, newest: int) -> None:
        versions = sorted(self.root.glob(VERSION_GLOB))
        for old in versions[: -self.keep]:
            if old.name != version_dir(self.root, newest).name:
                shutil.rmtree(old, ignore_errors=True)


class FilesystemWeightReceiver(WeightReceiver):
    """Loads the version ``LATEST`` names (or a given one) and checks it against its manifest."""

    def __init__(self, root: str | Path, verify: bool = False, wait_s: float = 300.0) -> None:
        self.root = Path(root)
        self.verify = verify
        self.wait_s = wait_s

    def _wait_for_manifest(self, directory: Path, version: int, attempt: int) -> dict:
        """The manifest of ``directory`` once it holds send ``attempt`` (or a later one) of ``version``."""
        deadline = time.monotonic() + self.wait_s
        while True:
            try:  # the sender renames a whole version into place; a resend moves the old one aside first
                manifest = json.loads((directory / MANIFEST).read_text())
                if int(manifest.get("attempt", 0)) >= attempt:
                    return manifest
            except FileNotFoundError:
                pass
            except (OSError, ValueError) as error:
                raise WeightSyncError(
                    f"weight push v{version} under {directory} has an unreadable manifest: {error}"
                ) from error
            if time.monotonic() > deadline:
                raise WeightStreamBroken(
                    f"send {attempt + 1} of weight push v{version} did not appear under {self.root} "
                    f"within {self.wait_s:.0f} s"
                )
            time.sleep(0.05)

    def latest_version(self) -> int | None:
        latest = self.root / LATEST
        if not latest.exists():
            return None
        return int(latest.read_text().strip().removeprefix("v"))

    def receive(self, version: int | None = None, attempt: int = 0) -> StagedWeights:
        """Push ``version``, its ``attempt``-th send or a later one (waiting up to ``wait_s`` for the
        sender to write it), or the latest push."""
        from safetensors.torch import load_file

        version = self.latest_version() if version is None else version
        if version is None:
            raise WeightSyncError(f"no weight push under {self.root} yet ({LATEST} is missing)")
        directory = version_dir(self.root, version)
        manifest = self._wait_for_manifest(directory, version, attempt)
        try:
            by_file: dict[str, list[TensorMeta]] = {}
            for entry in manifest["tensors"]:
                meta = TensorMeta(entry["name"], tuple(entry["shape"]), entry["dtype"], entry["checksum"])
                by_file.setdefault(entry["file"], []).append(meta)
            staged = StagedWeights(version=int(manifest["version"]), tensors={})
            for file_name, metas in by_file.items():
                loaded = load_file(directory / file_name)
                staged.add([(meta.name, loaded[meta.name]) for meta in metas], metas)
        except Exception as error:  # OSError, bad JSON, safetensors' own error type
            raise WeightSyncError(f"weight push v{version} under {directory} is unreadable: {error}") from error
        if self.verify:
            staged.verify_checksums()
        return staged
