"""Pick a weight transport from the recipe's ``rollout.weight_sync`` key."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import torch

from hetrl.transport.weights.base import WeightReceiver, WeightSender
from hetrl.transport.weights.collective import WeightSyncGroup

# kind -> (module, sender class, receiver class); modules import lazily (ipc needs CUDA pieces).
_CLASSES = {
    "collective": ("hetrl.transport.weights.collective", "CollectiveWeightSender", "CollectiveWeightReceiver"),
    "ipc": ("hetrl.transport.weights.ipc", "IpcWeightSender", "IpcWeightReceiver"),
    "filesystem": ("hetrl.transport.weights.filesystem", "FilesystemWeightSender", "FilesystemWeightReceiver"),
}
TRANSPORTS = tuple(_CLASSES)


def resolve_transport(weight_sync: str, *, on_gpu: bool, engines_on_sender_gpu: bool) -> str:
    """``auto`` -> ``ipc`` when every engine runs on the sending trainer rank's GPU, else ``collective``.

    The sender is trainer rank 0 (the exporter assembles full tensors there): its IPC handles open
    only in engines that see its GPU, e.g. one engine colocated across the trainer's node.
    """
    if weight_sync == "auto":
        return "ipc" if on_gpu and engines_on_sender_gpu else "collective"
    if weight_sync not in TRANSPORTS:
        raise ValueError(f"unknown rollout.weight_sync {weight_sync!r}; valid: auto, {', '.join(TRANSPORTS)}")
    if weight_sync == "ipc" and not (on_gpu and engines_on_sender_gpu):
        raise ValueError(
            "rollout.weight_sync='ipc' needs every engine colocated on trainer rank 0's GPU (one engine on the "
            "trainer's node); use 'collective' (NCCL broadcast) or 'filesystem'"
        )
    return weight_sync


def weight_sync_backend(kind: str, *, on_gpu: bool, engine_on_sender_gpu: bool, engine_tensor_parallel: int = 1) -> str:
    """The weight-sync group's payload backend: NCCL between GPUs, gloo (host memory) otherwise.

    NCCL refuses two ranks of one communicator on the same GPU, and a colocated engine on trainer
    rank 0's GPU is exactly that. An engine of several GPUs receives on another of its own
    (:func:`receive_device`); a one-GPU engine there leaves the push to gloo. IPC pushes keep a
    CUDA group (their payloads never touch it: handles travel over the gloo control group).
    """
    if not on_gpu:
        return "gloo"
    return "nccl" if kind == "ipc" or not engine_on_sender_gpu or engine_tensor_parallel > 1 else "gloo"


def receive_device(kind: str, backend: str, *, on_sender_gpu: bool) -> torch.device | None:
    """Where an engine receives NCCL payloads: its second GPU when its first is the sender's, else the default."""
    if backend == "nccl" and kind != "ipc" and on_sender_gpu:
        return torch.device("cuda", 1)
    return None


def _check_args(kind: str, group: WeightSyncGroup | None, root: str | Path | None) -> None:
    if kind == "filesystem" and root is None:
        raise ValueError("the 'filesystem' weight transport needs root= (a directory both sides can reach)")
    if kind in ("collective", "ipc") and group is None:
        raise ValueError(f"the {kind!r} weight transport needs group= (see init_weight_sync_group)")
    if kind not in TRANSPORTS:
        raise ValueError(f"unknown weight transport {kind!r}; valid: {', '.join(TRANSPORTS)}")


def _build(kind: str, side: int, group: WeightSyncGroup | None, root: str | Path | None, verify: bool, **extra: Any):
    _check_args(kind, group, root)
    module_name, *class_names = _CLASSES[kind]
    cls = getattr(importlib.import_module(module_name), class_names[side])
    return cls(root, verify=verify, **extra) if kind == "filesystem" else cls(group, verify=verify, **extra)


def build_weight_sender(
    kind: str, *, group: WeightSyncGroup | None = None, root: str | Path | None = None, verify: bool = False
) -> WeightSender:
    """The trainer-side transport ``kind``: ``group`` for collective/ipc, ``root`` for filesystem."""
    return _build(kind, 0, group, root, verify)


def build_weight_receiver(
    kind: str,
    *,
    group: WeightSyncGroup | None = None,
    root: str | Path | None = None,
    verify: bool = False,
    shared_memory: bool = False,
    wait_s: float = 300.0,
) -> WeightReceiver:
    """The engine-side counterpart of :func:`build_weight_sender`.

    ``shared_memory``: collective/ipc pushes are staged in ``/dev/shm`` files, for engines with TP
    workers (default: where they arrive); the filesystem transport always stages in host memory.
    ``wait_s``: how long the filesystem transport waits for a version to be written (collective
    ones take the group's timeout).
    """
    extra = {"wait_s": wait_s} if kind == "filesystem" else {"shared_memory": shared_memory}
    return _build(kind, 1, group, root, verify, **extra)
