"""Weight pushes into a live engine: greedy parity with HF after a sync, per-token versions, failed pushes,
a colocated engine's sleep and wakes around a push."""

from __future__ import annotations

import logging

import pytest

from hetrl.records import GenerationRequest
from hetrl.transport.weights import (
    StagedWeights,
    WeightSyncError,
    bucketize,
    build_weight_receiver,
    build_weight_sender,
)
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

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def engine(checkpoints):
    eng = greedy_engine(checkpoints["a"])
    yield eng
    eng.shutdown()


def test_sync_mid_generation_resumes_with_new_weights_and_tags_versions(engine, hf):
    assert all(engine_greedy(engine, "a")[i][0] == hf_greedy(hf["a"], p) for i, p in enumerate(PROMPTS))
    for request in greedy_requests("mid"):
        engine.submit(request)
    for _ in range(5):  # a prefill step then decode steps: every sample has a few v0 tokens
        assert engine.poll() == []
    staged, errors = push_over_gloo(bucketize(state_of(hf["b"]).items(), BUCKET_BYTES), version=1, verify=True)
    assert not errors and staged.version == 1
    engine.load_weights(staged)
    assert engine.version == 1 and engine.num_in_flight == len(PROMPTS)
    results = {int(r.request_id.removeprefix("mid")): r for r in engine.iter_results()}
    for index, prompt in enumerate(PROMPTS):
        result = results[index]
        switch = result.versions.index(1)
        assert 0 < switch < NEW_TOKENS and result.versions == [0] * switch + [1] * (NEW_TOKENS - switch)
        prefix = result.response_ids[:switch]
        assert prefix == hf_greedy(hf["a"], prompt, switch)
        assert result.response_ids[switch:] == hf_greedy(hf["b"], prompt + prefix, NEW_TOKENS - switch)


def test_after_sync_greedy_equals_hf_generate_of_new_model(engine, hf):
    assert engine.version == 1
    outputs = engine_greedy(engine, "b")
    for index, prompt in enumerate(PROMPTS):
        tokens, versions = outputs[index]
        assert tokens == hf_greedy(hf["b"], prompt) and versions == [1] * NEW_TOKENS


def test_interrupted_sync_keeps_the_old_version_serving(engine, hf):
    before = engine_greedy(engine, "pre")

    def dies_midway():
        buckets = bucketize(state_of(hf["a"]).items(), BUCKET_BYTES)
        yield next(buckets)
        yield next(buckets)
        raise RuntimeError("trainer rank 0 lost its exporter")

    outcome, errors = push_over_gloo(dies_midway(), version=2)
    assert isinstance(outcome, WeightSyncError) and len(errors) == 1
    assert engine.version == 1 and engine_greedy(engine, "post") == before


def test_incomplete_or_stale_push_is_refused_before_touching_weights(engine, hf, tmp_path):
    partial = state_of(hf["a"])
    dropped = partial.pop("model.layers.1.mlp.down_proj.weight")
    sender = build_weight_sender("filesystem", root=tmp_path, verify=True)
    receiver = build_weight_receiver("filesystem", root=tmp_path, verify=True)
    sender.send(bucketize(partial.items(), BUCKET_BYTES), version=2)
    with pytest.raises(WeightSyncError, match="1 missing"):
        engine.load_weights(receiver.receive())
    sender.send(
        bucketize({**partial, "model.layers.1.mlp.down_proj.weight": dropped.T.contiguous()}.items(), BUCKET_BYTES),
        version=3,
    )
    with pytest.raises(WeightSyncError, match="wrong shapes"):
        engine.load_weights(receiver.receive())
    outputs = engine_greedy(engine, "still-b")
    assert engine.version == 1 and all(
        outputs[i] == (hf_greedy(hf["b"], p), [1] * NEW_TOKENS) for i, p in enumerate(PROMPTS)
    )
    # A complete push through the filesystem fallback then takes the engine back to model a.
    sender.send(bucketize(state_of(hf["a"]).items(), BUCKET_BYTES), version=4)
    engine.load_weights(receiver.receive())
    with pytest.raises(WeightSyncError, match="not newer"):
        engine.load_weights(receiver.receive())
    outputs = engine_greedy(engine, "back-to-a")
    assert engine.version == 4 and all(
        outputs[i] == (hf_greedy(hf["a"], p), [4] * NEW_TOKENS) for i, p in enumerate(PROMPTS)
    )


def _nap(engine, tag: str) -> list[GenerationRequest]:
    """Start the greedy prompts, decode a few steps (prefill, then some tokens), release the engine's memory."""
    requests = greedy_requests(tag)
    for request in requests:
        engine.submit(request)
    for _ in range(5):
        assert engine.poll() == []
    engine.release_memory()
    assert engine.asleep == {"weights", "kv_cache"} and engine.num_in_flight == 0
    return requests


def test_a_sleeping_engine_decodes_nothing_and_wakes_for_the_push_then_to_generate(engine, hf, caplog, monkeypatch):
    """A colocated engine's turns (hetrl.loop.rollout_role): the samples the sleep interrupted and one submitted
    while asleep wait; a push needs the weights awake; the KV cache's wake resumes them under the pushed version,
    or, without partial rollouts, starts them again under it. On CPU the sleep frees nothing, and the log says so
    once, not at every sleep."""
    from hetrl.rollout import engine as engine_module

    engine_module._note_no_sleep_mode.cache_clear()  # once per process: count from here
    old = engine.version
    with caplog.at_level(logging.INFO, logger=engine_module.__name__):
        _nap(engine, "nap")
        late = greedy_requests("late")[0]
        engine.submit(late)
        assert not engine.has_work() and engine.poll() == []
        staged = StagedWeights(old + 1, state_of(hf["b"]))
        with pytest.raises(RuntimeError, match="weights are asleep"):
            engine.load_weights(staged)
        engine.wake("weights")
        engine.load_weights(staged)
        assert engine.version == old + 1 and engine.num_in_flight == 0  # waiting for the KV cache
        engine.wake("kv_cache")
        results = {r.request_id: r for r in engine.iter_results()}
        for index, prompt in enumerate(PROMPTS):
            result = results[f"nap{index}"]
            switch = result.versions.index(old + 1)
            assert 0 < switch < NEW_TOKENS and result.versions == [old] * switch + [old + 1] * (NEW_TOKENS - switch)
            prefix = result.response_ids[:switch]
            assert result.response_ids[switch:] == hf_greedy(hf["b"], prompt + prefix, NEW_TOKENS - switch)
        assert results["late0"].versions == [old + 1] * NEW_TOKENS
        assert results["late0"].response_ids == hf_greedy(hf["b"], late.prompt_ids)
        # Without partial rollouts the interrupted samples start again under the pushed weights: one version each.
        monkeypatch.setattr(engine, "cfg", engine.cfg.model_copy(update={"partial_rollout": False}))
        _nap(engine, "again")
        engine.wake("weights")
        engine.load_weights(StagedWeights(old + 2, state_of(hf["a"])))
        engine.wake("kv_cache")
        results = {r.request_id: r for r in engine.iter_results()}
        for index, prompt in enumerate(PROMPTS):
            assert results[f"again{index}"].response_ids == hf_greedy(hf["a"], prompt)
            assert results[f"again{index}"].versions == [old + 2] * NEW_TOKENS
        # A push refused while asleep: the interrupted samples go on under the old weights once the KV cache wakes.
        _nap(engine, "refused")
        engine.wake("weights")
        with pytest.raises(WeightSyncError, match="not newer"):
            engine.load_weights(StagedWeights(old + 2, state_of(hf["b"])))
        engine.wake("kv_cache")
        results = {r.request_id: r for r in engine.iter_results()}
    assert not engine.asleep
    for index, prompt in enumerate(PROMPTS):
        assert results[f"refused{index}"].response_ids == hf_greedy(hf["a"], prompt)
        assert results[f"refused{index}"].versions == [old + 2] * NEW_TOKENS
    notes = [r for r in caplog.records if "no sleep mode" in r.getMessage()]
    assert len(notes) == 1, [r.getMessage() for r in notes]
