"""Weight loading inside vLLM's worker processes, for engines with tensor parallelism.

Why this exists: with ``tensor_parallel_size > 1`` vLLM runs one worker process per TP rank, and
``collective_rpc`` carries its arguments to them through a pickled message queue, which neither
carries tensor iterators nor should carry gigabytes. So the engine hands the workers a *path*:
the push, written once as a safetensors file in shared memory (``/dev/shm``, i.e. RAM), which each
worker memory-maps and feeds to its own ``reload_weights``. vLLM's weight loaders then keep each
TP rank's shard of every full tensor, exactly as when loading a checkpoint.

:class:`SharedMemoryWeightLoader` is mixed into every worker through vLLM's
``worker_extension_cls``; :func:`write_shared_push`, :func:`remove_shared_push` and
:func:`sweep_stale_pushes` are the engine side.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

EXTENSION_CLASS = f"{__name__}.SharedMemoryWeightLoader"
PUSH_PREFIX = "hetrl-push-"


def shared_memory_dir() -> Path:
    """``/dev/shm`` where it exists (RAM-backed on Linux), else the temporary directory."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def write_shared_push(tensors: Mapping[str, torch.Tensor], version: int) -> Path:
    """Write a push as one safetensors file in shared memory; the caller removes it when loaded.

    The name carries this process's id (``hetrl-push-<pid>-v<version>-*``), so that a file left by
    a killed engine can be swept by the next one (:func:`sweep_stale_pushes`). Raises ``OSError``
    before writing when the directory lacks room (containers often give ``/dev/shm`` only 64 MiB).
    """
    from safetensors.torch import save_file

    directory = shared_memory_dir()
    need = sum(t.numel() * t.element_size() for t in tensors.values()) + (1 << 20)  # + the JSON header
    free = shutil.disk_usage(directory).free
    if free < need:
        raise OSError(f"{directory} has {free >> 20} MiB free; a push of {need >> 20} MiB needs more "
                      "(enlarge it, e.g. docker --shm-size, or run the engine with fewer TP workers)")
    handle, name = tempfile.mkstemp(prefix=f"{PUSH_PREFIX}{os.getpid()}-v{version}-", suffix=".safetensors", dir=directory)
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


def sweep_stale_pushes() -> int:
    """Remove push files whose engine process is gone (a SIGKILL skips every cleanup); returns how many."""
    removed = 0
    for path in shared_memory_dir().glob(f"{PUSH_PREFIX}*-v*.safetensors"):
        pid = path.name.removeprefix(PUSH_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            path.unlink(missing_ok=True)
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


class SharedMemoryWeightLoader:
    """vLLM worker mixin: ``collective_rpc("load_shared_push", args=(path,))`` loads a push on every TP rank."""

    def load_shared_push(self, path: str) -> dict[str, int | str]:
        """Load every tensor of the safetensors file at ``path`` into this worker's model.

        Returns ``{"path", "loaded"}`` or ``{"path", "error"}``, never raises: vLLM's executor
        answers a failed RPC as soon as the first worker fails and leaves the other workers'
        replies queued, where the *next* RPC would read them as its own. The path lets the engine
        tell a stale reply from this push's.
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
            return {"path": path, "error": f"{type(error).__name__}: {error}"}
        return {"path": path, "loaded": count}
