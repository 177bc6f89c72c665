"""Weight pushes by CUDA IPC handle, for engines colocated with the trainer on the same GPUs.

The trainer packs each bucket into one flat CUDA buffer and sends only its IPC handle (pickled,
over the gloo control group of :class:`WeightSyncGroup`); the engine maps the buffer, copies it
into staging memory of its own and acknowledges, after which the trainer frees the buffer. No
bytes cross PCIe or the network. Needs trainer and engine processes on the same physical GPU.
"""

from __future__ import annotations

import base64
import pickle
from dataclasses import asdict

import torch
from torch.multiprocessing.reductions import reduce_tensor

from hetrl.transport.weights.base import TensorMeta, WeightStreamBroken, WeightSyncError
from hetrl.transport.weights.collective import (
    BUCKET,
    CollectiveWeightReceiver,
    CollectiveWeightSender,
    WeightSyncGroup,
    send_message,
)


def _acknowledge(group: WeightSyncGroup) -> None:
    """Every engine has copied the bucket: the trainer may release its buffer."""
    group.control.allreduce([torch.zeros(1)]).wait()


def _require_cuda(group: WeightSyncGroup) -> None:
    if group.device.type != "cuda":
        raise RuntimeError("the 'ipc' weight transport needs CUDA tensors; use 'collective' (gloo) on CPU")


class IpcWeightSender(CollectiveWeightSender):
    """Trainer rank 0 on the engines' GPU: sends handles, not bytes."""

    def __init__(self, group: WeightSyncGroup, verify: bool = False) -> None:
        _require_cuda(group)
        super().__init__(group, verify)

    def _send_bucket(self, metas: list[TensorMeta], payload: torch.Tensor, version: int) -> int:
        payload = payload.to(self.group.device)
        handle = base64.b64encode(pickle.dumps(reduce_tensor(payload))).decode()
        meta = {"version": version, "tensors": [asdict(m) for m in metas], "ipc_handle": handle}
        send_message(self.group, BUCKET, meta)
        _acknowledge(self.group)  # keeps `payload` alive until every engine has its copy
        return payload.numel()


class IpcWeightReceiver(CollectiveWeightReceiver):
    """Engine on the trainer's GPU: maps each bucket by handle and copies it into staging memory."""

    def __init__(self, group: WeightSyncGroup, verify: bool = False, shared_memory: bool = False) -> None:
        _require_cuda(group)
        super().__init__(group, verify, shared_memory)

    def _bucket_buffer(self, meta: dict, payload: torch.Tensor | None) -> torch.Tensor:
        if "ipc_handle" not in meta:
            raise WeightStreamBroken(
                "an 'ipc' receiver got a bucket without an IPC handle: the sender uses another transport"
            )
        failure: Exception | None = None
        try:
            rebuild, args = pickle.loads(base64.b64decode(meta["ipc_handle"]))
            shared = rebuild(*args)
            staged = shared.clone()
            torch.cuda.current_stream().synchronize()
            del shared
        except Exception as error:  # the sender still waits for this engine's acknowledgement
            failure = error
        try:
            _acknowledge(self.group)
        except RuntimeError as error:  # gloo timeouts and lost peers
            raise WeightStreamBroken(f"could not acknowledge an IPC bucket to the sender: {error}") from error
        if failure is not None:
            raise WeightSyncError(f"could not map the bucket's IPC handle: {failure}") from failure
        return staged
