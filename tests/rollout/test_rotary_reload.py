"""A weight push leaves the engine's rotary cache as it was, and vLLM's warning about it is filtered.

vLLM's layerwise reload counts RotaryEmbedding's ``cos_sin_cache`` as a tensor to load; no push
carries it, so it warns and puts the existing cache back (hetrl.rollout.engine._RotaryReloadNotice).
"""

from __future__ import annotations

import logging

import pytest
import torch

from hetrl.rollout.engine import _RotaryReloadNotice
from hetrl.transport.weights import bucketize
from tests.rollout.helpers import BUCKET_BYTES, Messages, greedy_engine, push_over_gloo, state_of

pytestmark = pytest.mark.vllm
NOTICE = "RotaryEmbedding: Failed to load weights"


def _rotary_caches(worker) -> dict[str, torch.Tensor]:
    return {
        name: buf.clone() for name, buf in worker.model_runner.model.named_buffers() if name.endswith("cos_sin_cache")
    }


def _push(engine, model, version: int) -> None:
    staged, errors = push_over_gloo(bucketize(state_of(model).items(), BUCKET_BYTES), version=version)
    assert not errors
    engine.load_weights(staged)


def test_push_keeps_the_rotary_cache_and_its_warning_is_filtered(checkpoints, hf, monkeypatch):
    engine = greedy_engine(checkpoints["a"])
    messages = Messages()
    reload_logger = logging.getLogger(_RotaryReloadNotice.LOGGER)
    reload_logger.addHandler(messages)
    try:
        before = engine._engine.collective_rpc(_rotary_caches)[0]
        _push(engine, hf["b"], version=1)
        after = engine._engine.collective_rpc(_rotary_caches)[0]
        assert before and before.keys() == after.keys()
        assert all(torch.equal(before[name], after[name]) for name in before)
        assert NOTICE not in messages.seen
        monkeypatch.setattr(
            reload_logger, "filters", []
        )  # vLLM still says it, word for word: the filter is what drops it
        _push(engine, hf["a"], version=2)
        assert NOTICE in messages.seen
    finally:
        reload_logger.removeHandler(messages)
        engine.shutdown()
