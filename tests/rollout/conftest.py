"""Shared fixtures: tiny random-init HF checkpoints (built here, no hub) and one vLLM engine per module."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

from hetrl.config.model import ModelConfig  # noqa: E402

# head_dim 32 is the smallest vLLM's CPU attention accepts.
TINY = dict(
    hidden_size=128,
    num_layers=2,
    num_attention_heads=4,
    num_query_groups=2,
    ffn_hidden_size=256,
    vocab_size=128,
    max_position_embeddings=256,
)


@pytest.fixture(scope="module", autouse=True)
def _engine_environment_stays_here():
    """An in-process engine sets vLLM's variables (thread bind, ...) in this process's environment; a run that a
    later test launches would inherit them as a site's choice (a TP=2 bind for its TP=1 engine). Restored per module."""
    saved = {name: value for name, value in os.environ.items() if name.startswith("VLLM_")}
    yield
    for name in [name for name in os.environ if name.startswith("VLLM_")]:
        del os.environ[name]
    os.environ.update(saved)


def tiny_model_config(**overrides) -> ModelConfig:
    return ModelConfig(**{**TINY, **overrides})


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Two models of one shape with different random weights: 'a' is served first, 'b' is pushed."""
    from hetrl.models.hf import build_random_hf_checkpoint

    root = tmp_path_factory.mktemp("rollout_models")
    cfg = tiny_model_config()
    # init_std 0.1 spreads the logits, so greedy decoding has no fp32 near-ties between HF and vLLM.
    return {
        name: build_random_hf_checkpoint(cfg, root / name, seed=seed, init_std=0.1)
        for name, seed in (("a", 1), ("b", 2))
    }


@pytest.fixture(scope="session")
def hf(checkpoints):
    """The HF reference models of the checkpoints, in fp32."""
    from tests.rollout.helpers import load_hf

    return {name: load_hf(path) for name, path in checkpoints.items()}
