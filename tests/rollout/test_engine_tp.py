"""An engine with tensor parallelism (TP=2 worker processes): greedy parity, weight pushes, failed pushes.

vLLM's TP workers are processes of their own; pushes reach them through shared memory
(``hetrl.rollout.worker_extension``, ``hetrl.transport.weights.shared_memory``). On this CPU each worker computes on one
core.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hetrl.transport.weights import StagedWeights, WeightSyncError, bucketize, shared_memory
from tests.rollout.helpers import (
    BUCKET_BYTES,
    NEW_TOKENS,
    PROMPTS,
    engine_greedy,
    greedy_engine,
    greedy_requests,
    hf_greedy,
    push_over_gloo,
    state_of,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # two worker processes start in ~30-40 s


@pytest.fixture(scope="module")
def engine(checkpoints):
    eng = greedy_engine(checkpoints["a"], engine_tensor_parallel=2)
    yield eng
    eng.shutdown()


def test_tp2_engine_serves_and_takes_a_push_mid_generation(engine, hf):
    assert all(
        engine_greedy(engine, "a")[i] == (hf_greedy(hf["a"], p), [0] * NEW_TOKENS) for i, p in enumerate(PROMPTS)
    )
    for request in greedy_requests("mid"):
        engine.submit(request)
    for _ in range(5):
        assert engine.poll() == []
    staged, errors = push_over_gloo(
        bucketize(state_of(hf["b"]).items(), BUCKET_BYTES), version=1, verify=True, shared_memory=True
    )
    assert not errors and staged.shared_dir.is_dir()  # staged where the TP workers map it
    engine.load_weights(staged)
    results = {int(r.request_id.removeprefix("mid")): r for r in engine.iter_results()}
    for index, prompt in enumerate(PROMPTS):
        result = results[index]
        switch = result.versions.index(1)
        assert 0 < switch < NEW_TOKENS
        prefix = result.response_ids[:switch]
        assert prefix == hf_greedy(hf["a"], prompt, switch)
        assert result.response_ids[switch:] == hf_greedy(hf["b"], prompt + prefix, NEW_TOKENS - switch)
    assert all(
        engine_greedy(engine, "b")[i] == (hf_greedy(hf["b"], p), [1] * NEW_TOKENS) for i, p in enumerate(PROMPTS)
    )
    assert not staged.shared_dir.exists() and not list(
        shared_memory.shared_memory_dir().glob(f"hetrl-push-{os.getpid()}-*")
    )


def test_a_push_the_workers_cannot_read_stops_serving_until_a_good_one(engine, hf, monkeypatch):
    """Workers that fail while loading may hold a mix of versions: the engine refuses work, then recovers."""
    assert engine.version == 1
    real_write = shared_memory.write_push

    def torn_write(tensors, version: int) -> Path:
        path = real_write(tensors, version)
        bucket = sorted(path.glob("bucket_*.bin"))[-1]
        with open(bucket, "r+b") as handle:
            handle.truncate(bucket.stat().st_size // 2)
        return path

    monkeypatch.setattr(shared_memory, "write_push", torn_write)
    with pytest.raises(WeightSyncError, match="failed midway"):
        engine.load_weights(StagedWeights(version=2, tensors=state_of(hf["a"])))
    with pytest.raises(RuntimeError, match="refuses work"):
        engine.submit(greedy_requests("refused")[0])
    monkeypatch.setattr(shared_memory, "write_push", real_write)
    engine.load_weights(StagedWeights(version=3, tensors=state_of(hf["a"])))
    assert all(
        engine_greedy(engine, "a3")[i] == (hf_greedy(hf["a"], p), [3] * NEW_TOKENS) for i, p in enumerate(PROMPTS)
    )
