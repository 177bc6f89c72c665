"""Weight loading inside vLLM's worker processes, for engines with tensor parallelism.

Why this exists: with ``tensor_parallel_size > 1`` vLLM runs one worker process per TP rank, and
``collective_rpc`` carries its arguments to them through a pickled message queue, which neither
carries tensor iterators nor should carry gigabytes. So the engine hands the workers a *path*: the
push, staged in shared memory (``/dev/shm``, i.e. RAM; see
:mod:`hetrl.transport.weights.shared_memory`), which each worker maps and feeds to its own
``reload_weights``. vLLM's weight loaders then keep each TP rank's shard of every full tensor,
exactly as when loading a checkpoint.

:class:`SharedMemoryWeightLoader` is mixed into every worker through vLLM's ``worker_extension_cls``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from hetrl.transport.weights.shared_memory import read_push

EXTENSION_CLASS = f"{__name__}.SharedMemoryWeightLoader"


class SharedMemoryWeightLoader:
    """vLLM worker mixin: ``collective_rpc("load_shared_push", args=(path,))`` loads a push on every TP rank."""

    def load_shared_push(self, path: str) -> dict[str, int | str]:
        """Load every tensor of the push at ``path`` into this worker's model.

        Returns ``{"path", "loaded"}`` or ``{"path", "error"}``, never raises: vLLM's executor
        answers a failed RPC as soon as the first worker fails and leaves the other workers'
        replies queued, where the *next* RPC would read them as its own. The path lets the engine
        tell a stale reply from this push's.
        """
        count = 0
        try:

            def tensors() -> Iterator[tuple[str, torch.Tensor]]:
                nonlocal count
                for name, tensor in read_push(path):
                    count += 1
                    yield name, tensor

            self.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)  # type: ignore[attr-defined]
        except Exception as error:  # noqa: BLE001 - reported to the engine, which stops serving
            return {"path": path, "error": f"{type(error).__name__}: {error}"}
        return {"path": path, "loaded": count}
