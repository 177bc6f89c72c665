"""Weight loading inside vLLM's worker processes, for engines with tensor parallelism.

Why this exists: with ``tensor_parallel_size > 1`` vLLM runs one worker process per TP rank, and
``collective_rpc`` carries its arguments to them through a pickled message queue, which neither
carries tensor iterators nor should carry gigabytes. So the engine hands the workers a *path*:
the push, written once as a safetensors file in shared memory (``/dev/shm``, i.e. RAM), which each
worker memory-maps and feeds to its own ``reload_weights``. vLLM's weight loaders then keep each
TP rank's shard of every full tensor, exactly as when loading a checkpoint.

:class:`SharedMemoryWeightLoader` is mixed into every worker through vLLM's
``worker_extension_cls``; :func:`write_shared_push` and :func:`remove_shared_push` are the engine
side.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

EXTENSION_CLASS = f"{__name__}.SharedMemoryWeightLoader"


def shared_memory_dir() -> Path:
    """``/dev/shm`` where it exists (RAM-backed on Linux), else the temporary directory."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def write_shared_push(tensors: Mapping[str, torch.Tensor], version: int) -> Path:
    """Write a push as one safetensors file in shared memory; the caller removes it when loaded."""
    from safetensors.torch import save_file

    handle, name = tempfile.mkstemp(prefix=f"hetrl-push-v{version}-", suffix=".safetensors", dir=shared_memory_dir())
    os.close(handle)
    path = Path(name)
    try:
        save_file({k: t.detach().contiguous().cpu() for k, t in tensors.items()}, str(path))
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def remove_shared_push(path: Path) -> None:
    path.unlink(missing_ok=True)


class SharedMemoryWeightLoader:
    """vLLM worker mixin: ``collective_rpc("load_shared_push", args=(path,))`` loads a push on every TP rank."""

    def load_shared_push(self, path: str) -> int | str:
        """Load every tensor of the safetensors file at ``path`` into this worker's model.

        Returns the number of tensors loaded, or the error as text. It never raises: vLLM's
        executor answers a failed RPC as soon as the first worker fails and leaves the other
        workers' replies queued, where the *next* RPC would read them as its own.
        """
        from safetensors import safe_open

        count = 0
        try:
            with safe_open(path, framework="pt", device="cpu") as handle:

                def tensors() -> Iterator[tuple[str, torch.Tensor]]:
                    nonlocal count
                    for name in handle.keys():
                        count += 1
                        yield name, handle.get_tensor(name)

                self.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)  # type: ignore[attr-defined]
        except Exception as error:  # noqa: BLE001 - reported to the engine, which stops serving
            return f"{type(error).__name__}: {error}"
        return count
