"""Test helpers shared by the rollout tests: HF reference models and a two-rank gloo push."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from hetrl.transport.weights import StagedWeights, WeightSyncError, build_weight_receiver, build_weight_sender, init_weight_sync_group


def load_hf(path: Path):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_sender(port: int, buckets, version: int, verify: bool, errors: list) -> None:
    try:
        group = init_weight_sync_group("127.0.0.1", port, rank=0, world_size=2, timeout_s=30)
        build_weight_sender("collective", group=group, verify=verify).send(buckets, version)
    except BaseException as error:  # noqa: BLE001 - reported to the test thread
        errors.append(error)


def push_over_gloo(buckets, version: int, verify: bool = False) -> tuple[StagedWeights | WeightSyncError, list]:
    """Trainer rank 0 in a thread, engine rank 1 here: one gloo group of their own."""
    port, errors = free_port(), []
    thread = threading.Thread(target=_run_sender, args=(port, buckets, version, verify, errors))
    thread.start()
    group = init_weight_sync_group("127.0.0.1", port, rank=1, world_size=2, timeout_s=30)
    try:
        outcome = build_weight_receiver("collective", group=group, verify=verify).receive()
    except WeightSyncError as error:
        outcome = error
    thread.join()
    return outcome, errors
