"""Test helpers shared by the rollout tests: HF reference models, greedy comparisons, a two-rank gloo push."""

from __future__ import annotations

import logging
import socket
import threading
from pathlib import Path

import torch

from hetrl.records import GenerationRequest, SamplingParams
from hetrl.transport.weights import (
    StagedWeights,
    WeightSyncError,
    build_weight_receiver,
    build_weight_sender,
    init_weight_sync_group,
)

NEW_TOKENS = 16
BUCKET_BYTES = 64 << 10  # many buckets even for the tiny model


def load_hf(path: Path):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()


class Messages(logging.Handler):
    """The messages a logger passed on (after its filters)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage())


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


def push_over_gloo(
    buckets, version: int, verify: bool = False, shared_memory: bool = False
) -> tuple[StagedWeights | WeightSyncError, list]:
    """Trainer rank 0 in a thread, engine rank 1 here: one gloo group of their own."""
    port, errors = free_port(), []
    thread = threading.Thread(target=_run_sender, args=(port, buckets, version, verify, errors))
    thread.start()
    group = init_weight_sync_group("127.0.0.1", port, rank=1, world_size=2, timeout_s=30)
    try:
        outcome = build_weight_receiver("collective", group=group, verify=verify, shared_memory=shared_memory).receive()
    except WeightSyncError as error:
        outcome = error
    thread.join()
    return outcome, errors


PROMPTS = [[5, 17, 33, 9, 60, 41], [70, 12, 8, 8, 91], [44, 3, 29, 77, 15, 16, 52, 6]]


def hf_greedy(model, prompt: list[int], max_new_tokens: int = NEW_TOKENS) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
        )
    return out[0, len(prompt) :].tolist()


def greedy_requests(tag: str, max_tokens: int = NEW_TOKENS) -> list[GenerationRequest]:
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [GenerationRequest(f"{tag}{i}", prompt, sampling) for i, prompt in enumerate(PROMPTS)]


def engine_greedy(engine, tag: str) -> dict[int, tuple[list[int], list[int]]]:
    results = engine.generate(greedy_requests(tag))
    return {int(r.request_id.removeprefix(tag)): (r.response_ids, r.versions) for r in results}


def state_of(model) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def greedy_engine(model_path: Path, **overrides):
    """A small greedy engine for the weight-sync tests (``overrides``: more RolloutConfig keys)."""
    from hetrl.config.rollout import RolloutConfig
    from hetrl.rollout.engine import GenerationEngine

    cfg = RolloutConfig(max_model_len=256, kv_cache_memory_mb=64, max_num_seqs=16, temperature=0.0, **overrides)
    return GenerationEngine(model_path, cfg, dtype="float32", seed=0)
