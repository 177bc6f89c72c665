"""Trainer -> engine weight transports: collective broadcast (gloo/NCCL), CUDA IPC, filesystem."""

from hetrl.transport.weights.base import (
    Bucket,
    StagedWeights,
    TensorMeta,
    WeightReceiver,
    WeightSender,
    WeightStreamBroken,
    WeightSyncError,
    bucketize,
    tensor_checksum,
)
from hetrl.transport.weights.collective import WeightSyncGroup, init_weight_sync_group
from hetrl.transport.weights.factory import (
    build_weight_receiver,
    build_weight_sender,
    receive_device,
    resolve_transport,
    weight_sync_backend,
)

__all__ = [
    "Bucket",
    "StagedWeights",
    "TensorMeta",
    "WeightReceiver",
    "WeightSender",
    "WeightStreamBroken",
    "WeightSyncError",
    "WeightSyncGroup",
    "bucketize",
    "build_weight_receiver",
    "build_weight_sender",
    "init_weight_sync_group",
    "receive_device",
    "resolve_transport",
    "tensor_checksum",
    "weight_sync_backend",
]
