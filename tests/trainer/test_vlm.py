"""A LLaVA policy on the trainer: placeholder expansion, pixels, HF round trip, HF logits, training, freeze.

The HF side is a random-init ``LlavaForConditionalGeneration`` (CLIP tower, GELU projector, Llama
text model) written by ``hetrl.models.hf.build_random_hf_checkpoint`` with init_std 0.2, so that
logits are far from flat and a permuted head, a causal ViT mask or a misplaced image would show.
Layouts run on the session's two gloo ranks (``two_ranks``).
"""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from samples import whole_step
from test_hf_convert import read_safetensors

from hetrl.config.algorithm import AlgorithmConfig
from hetrl.config.model import ModelConfig, VisionConfig
from hetrl.config.trainer import TrainerConfig
from hetrl.models.hf import CHAR_IMAGE_TOKEN_ID, build_random_hf_checkpoint
from hetrl.records import Sample
from hetrl.trainer.batch import build_train_batch
from hetrl.trainer.vision import image_spec, model_tokens, pixel_values

IMG = CHAR_IMAGE_TOKEN_ID
VISION = dict(image_size=32, patch_size=16, hidden_size=64, num_layers=2, num_attention_heads=2, ffn_hidden_size=96)
VLM = ModelConfig(
    arch="llava",
    vocab_size=128,
    hidden_size=64,
    num_layers=2,
    num_attention_heads=4,
    num_query_groups=2,
    ffn_hidden_size=96,
    max_position_embeddings=256,
    vision=VisionConfig(**VISION),
)
FROZEN = VLM.model_copy(update={"vision": VisionConfig(**VISION, freeze=True)})
TPI = VLM.vision.tokens_per_image  # 4 positions per image
ALGO = AlgorithmConfig(name="grpo", group_size=2, kl_coef=0.1)


def _image(seed: int, size: tuple[int, int] = (40, 50), png: bool = False):
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    if not png:
        return image
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _sample(i: int, prompt: list[int], completion: list[int], mask: list[int], images: list) -> Sample:
    return Sample(
        sample_id=f"s{i}",
        group_id=f"g{i // 2}",
        task_name="t",
        prompt_ids=prompt,
        completion_ids=completion,
        loss_mask=mask,
        logprobs=[-0.1 * (j + 1) * m for j, m in enumerate(mask)],
        versions=[0 if m else -1 for m in mask],
        images=images,
    )


def vlm_samples() -> list[Sample]:
    """Four samples: images in prompts, one in an observation turn of a completion, one sample without images."""
    return [
        _sample(0, [5, IMG, 7, 8], [9, 10, 11], [1, 1, 1], [_image(0)]),
        # a multi-turn episode: the second observation brings a screenshot (loss mask 0 around it)
        _sample(
            1,
            [IMG, 6, 7],
            [12, 13, 20, IMG, 21, 14, 15],
            [1, 1, 0, 0, 0, 1, 1],
            [_image(1, png=True), _image(2, (64, 64))],
        ),
        _sample(2, [4, 5, 6, 7, 8], [16, 17], [1, 1], []),
        _sample(3, [IMG, IMG, 30], [31, 32, 33, 34], [1, 0, 1, 1], [_image(3, (20, 90)), _image(4, png=True)]),
    ]


# --- model space: placeholders and pixels (no megatron) ----------------------------------------


def test_placeholders_expand_in_model_space_and_sample_space_keeps_completion_columns() -> None:
    spec = image_spec(VLM)
    sample = vlm_samples()[1]
    layout = model_tokens(sample, spec)
    assert layout.ids == [IMG] * TPI + [6, 7, 12, 13, 20] + [IMG] * TPI + [21, 14, 15]
    assert layout.completion_at[0] == TPI + 2  # the prompt takes its image's positions and two tokens
    assert layout.image_positions == list(range(TPI)) + list(range(TPI + 5, 2 * TPI + 5))
    # every original completion token sits where its id is in model space
    assert [layout.ids[k] for k in layout.completion_at] == sample.completion_ids

    batch = build_train_batch([sample], micro_batch_size=1, images=spec)
    mb = batch.micro_batches[0]
    assert mb.tokens[0].tolist() == layout.ids and mb.position_ids[0].tolist() == list(range(len(layout.ids)))
    assert mb.image_mask[0].nonzero().flatten().tolist() == layout.image_positions
    # sample space: one column per completion token, exactly the sample's lists
    assert mb.loss_mask[0].tolist() == sample.loss_mask
    torch.testing.assert_close(
        mb.rollout_logprobs[0], torch.tensor(sample.logprobs) * torch.tensor(sample.loss_mask, dtype=torch.float32)
    )
    labels = mb.labels.reshape(-1)[mb.gather_index[0]]
    assert labels.tolist() == sample.completion_ids  # each column reads the position that predicts its token
    assert mb.num_tokens == len(layout.ids)
    torch.testing.assert_close(mb.pixel_values, pixel_values(sample.images, spec), rtol=0, atol=0)


def test_packed_rows_keep_images_in_order() -> None:
    spec = image_spec(VLM)
    samples = vlm_samples()
    batch = build_train_batch(samples, micro_batch_size=4, pack_length=64, images=spec)
    assert len(batch.micro_batches) == 1
    mb = batch.micro_batches[0]
    placed = [samples[i] for i in mb.sample_indices]
    assert mb.image_mask.sum() == TPI * sum(len(s.images) for s in placed)
    torch.testing.assert_close(
        mb.pixel_values, pixel_values([img for s in placed for img in s.images], spec), rtol=0, atol=0
    )
    for row, s in enumerate(placed):
        assert mb.labels.reshape(-1)[mb.gather_index[row, : len(s.completion_ids)]].tolist() == s.completion_ids
    padded = batch.with_length_multiple(4).uniform()  # span padding moves the image positions with their tokens
    moved = padded.micro_batches[0]
    assert torch.equal(moved.tokens[moved.image_mask], mb.tokens[mb.image_mask])


def test_placeholder_errors_name_the_sample() -> None:
    spec = image_spec(VLM)
    missing = _sample(7, [5, IMG], [6], [1], [])
    with pytest.raises(ValueError, match="s7 has 1 image placeholders .* but 0 images"):
        model_tokens(missing, spec)
    sampled = _sample(8, [5], [IMG, 6], [1, 1], [_image(0)])
    with pytest.raises(ValueError, match="s8: completion tokens \\[0\\] are image placeholders with loss mask 1"):
        model_tokens(sampled, spec)
    with pytest.raises(ValueError, match="no vision encoder"):
        model_tokens(vlm_samples()[0], None)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    return build_random_hf_checkpoint(VLM, tmp_path_factory.mktemp("llava_hf"), seed=5, init_std=0.2)


def test_pixel_values_match_the_checkpoint_processor(hf_dir: Path) -> None:
    import transformers

    images = [_image(1, png=True), _image(2, (64, 64)), _image(3, (20, 90))]
    processor = transformers.AutoProcessor.from_pretrained(hf_dir)
    from hetrl.models.images import to_pil

    expected = processor.image_processor(images=[to_pil(i) for i in images], return_tensors="pt")["pixel_values"]
    assert torch.equal(pixel_values(images, image_spec(VLM)), expected)


# --- HF <-> megatron: round trip and logits ----------------------------------------------------

LAYOUTS = {
    "tp1": (dict(), None),
    "tp2": (dict(tensor_parallel=2), None),
    "tp2_packed": (dict(tensor_parallel=2), 64),
    "pp2": (dict(pipeline_parallel=2), None),
}


def _gathered_logits(model, mb, groups) -> torch.Tensor:
    import torch.distributed as dist

    with torch.no_grad():
        local = model(mb.tokens, mb.position_ids, None, images=mb.pixel_values, image_mask=mb.image_mask)
    shards = [torch.empty_like(local) for _ in range(groups.tp_size)]
    dist.all_gather(shards, local.contiguous(), group=groups.tp)
    return torch.cat(shards, dim=-1)[..., : VLM.vocab_size]


def _convert(rank: int, world_size: int, name: str, hf_dir: Path, out_dir: Path, samples: list[Sample]) -> dict:
    """Import into the layout; logits of one sample (PP=1), sample-space log-probs, HF export, pushed names."""
    from hetrl.trainer.exporter import iter_hf_weight_buckets, save_hf_checkpoint
    from hetrl.trainer.hf_convert import load_hf_checkpoint
    from hetrl.trainer.logprobs import forward_logprobs
    from hetrl.trainer.model import build_gpt_model
    from hetrl.trainer.parallel import destroy_parallel, init_parallel

    layout, pack_length = LAYOUTS[name]
    tcfg = TrainerConfig(precision="fp32", **layout)
    groups = init_parallel(tcfg)
    try:
        model = build_gpt_model(VLM, tcfg, pg_collection=groups.pg_collection, seed=11).eval()
        load_hf_checkpoint(model, hf_dir, groups.pg_collection)
        spec = image_spec(VLM)
        batch = build_train_batch(samples, micro_batch_size=2, pack_length=pack_length, images=spec)
        logprobs, _ = forward_logprobs(model, batch, groups)
        out = {"logprobs": logprobs, "order": batch.global_indices}
        if tcfg.pipeline_parallel == 1 and pack_length is None:
            one = build_train_batch(samples[1:2], micro_batch_size=1, images=spec).micro_batches[0]
            out["logits"] = _gathered_logits(model, one, groups)
            other = replace(samples[1], images=[samples[1].images[0], _image(9)])
            out["logits_other"] = _gathered_logits(
                model, build_train_batch([other], micro_batch_size=1, images=spec).micro_batches[0], groups
            )
        save_hf_checkpoint(
            model, VLM, out_dir, max_shard_bytes=200_000, copy_files_from=hf_dir, pg_collection=groups.pg_collection
        )
        out["pushed"] = [
            n
            for bucket in iter_hf_weight_buckets(model, VLM.vocab_size, pg_collection=groups.pg_collection)
            for n, _ in bucket
        ]
        return out
    finally:
        destroy_parallel()


@pytest.fixture(scope="module")
def converted(two_ranks, hf_dir, tmp_path_factory) -> dict:
    samples = vlm_samples()
    results = {}
    for name in LAYOUTS:
        out_dir = tmp_path_factory.mktemp(f"llava_{name}_export")
        results[name] = (out_dir, two_ranks.run(_convert, name, hf_dir, out_dir, samples))
    return results


def _hf_model(directory: Path):
    import transformers

    return transformers.AutoModelForImageTextToText.from_pretrained(directory, dtype=torch.float32).eval()


def _hf_logits(model, sample: Sample) -> torch.Tensor:
    spec = image_spec(VLM)
    ids = torch.tensor([model_tokens(sample, spec).ids])
    pixels = pixel_values(sample.images, spec) if sample.images else None
    with torch.no_grad():
        return model(input_ids=ids, pixel_values=pixels).logits


def _hf_logprobs(model, samples: list[Sample]) -> torch.Tensor:
    """Sample-space ``[N, Tc]`` log-probs of the completion tokens under the HF model (0 off-mask)."""
    spec = image_spec(VLM)
    out = torch.zeros(len(samples), max(len(s.completion_ids) for s in samples))
    for i, s in enumerate(samples):
        logp = torch.log_softmax(_hf_logits(model, s)[0], dim=-1)
        at = torch.tensor(model_tokens(s, spec).completion_at)
        lp = logp[at - 1, torch.tensor(s.completion_ids)]
        out[i, : len(s.completion_ids)] = lp * torch.tensor(s.loss_mask, dtype=torch.float32)
    return out


@pytest.mark.parametrize("name", ["tp1", "tp2"])
def test_logits_match_hf_and_follow_the_images(converted, hf_dir, name: str) -> None:
    model, sample = _hf_model(hf_dir), vlm_samples()[1]
    reference = _hf_logits(model, sample)
    assert reference.std() > 0.5
    for rank in converted[name][1]:
        diff = float((rank["logits"] - reference).abs().max())
        print(f"{name}: max |logit - HF logit| = {diff:.2e}")
        assert diff < 1e-5
        # another second image (the observation's screenshot): the logits move from its positions on
        moved = (rank["logits_other"] - rank["logits"]).abs().amax(-1)[0]
        second = TPI + 5
        assert float(moved[:second].max()) < 1e-6 and float(moved[second:].max()) > 0.1


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_sample_logprobs_match_hf_in_every_layout(converted, hf_dir, name: str) -> None:
    samples = vlm_samples()
    reference = _hf_logprobs(_hf_model(hf_dir), samples)
    for rank in converted[name][1]:
        full = torch.zeros_like(reference)
        full[rank["order"]] = rank["logprobs"][:, : reference.shape[1]]
        torch.testing.assert_close(full, reference, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_export_of_import_is_bit_exact_and_loadable(converted, hf_dir, name: str) -> None:
    out_dir, ranks = converted[name]
    original, exported = read_safetensors(hf_dir), read_safetensors(out_dir)
    assert sorted(exported) == sorted(original)
    for key, tensor in original.items():
        assert exported[key].dtype == tensor.dtype and torch.equal(exported[key], tensor), key
    # a weight push leaves out what never trains: HF's unused post_layernorm
    pushed = ranks[0]["pushed"]
    assert sorted(pushed) == sorted(k for k in original if "post_layernorm" not in k)
    assert ranks[1]["pushed"] == []


def test_export_loads_in_transformers_with_its_processor(converted, hf_dir) -> None:
    import transformers

    out_dir, _ = converted["tp2"]
    processor = transformers.AutoProcessor.from_pretrained(out_dir)
    assert type(processor).__name__ == "LlavaProcessor"
    sample = vlm_samples()[0]
    torch.testing.assert_close(
        _hf_logits(_hf_model(out_dir), sample), _hf_logits(_hf_model(hf_dir), sample), rtol=0, atol=0
    )


# --- training ----------------------------------------------------------------------------------


def _train(
    rank: int,
    world_size: int,
    mcfg: ModelConfig,
    layout: dict,
    hf_dir: Path,
    out_dir: Path | None,
    samples: list[Sample],
) -> dict:
    from hetrl.trainer.exporter import iter_hf_tensors, iter_hf_weight_buckets, save_hf_checkpoint
    from hetrl.trainer.hf_convert import load_hf_checkpoint
    from hetrl.trainer.parallel import destroy_parallel
    from hetrl.trainer.policy import PolicyTrainer

    tcfg = TrainerConfig(precision="fp32", lr=1e-3, micro_batch_size=2, grad_clip=1.0, **layout)
    trainer = PolicyTrainer(mcfg, tcfg, ALGO, seed=11, max_len=16)
    try:
        load_hf_checkpoint(trainer.module, hf_dir, trainer.groups.pg_collection)
        trainer.sync_reference()
        pg = trainer.groups.pg_collection
        before = dict(iter_hf_tensors(trainer.module, mcfg.vocab_size, pg_collection=pg, include_frozen=True))
        batch = trainer.make_batch(samples).with_advantages(torch.tensor([1.0, -1.0, 0.5, -0.5]))
        metrics = trainer.train_step(batch)
        after = dict(iter_hf_tensors(trainer.module, mcfg.vocab_size, pg_collection=pg, include_frozen=True))
        pushed = [
            n for bucket in iter_hf_weight_buckets(trainer.module, mcfg.vocab_size, pg_collection=pg) for n, _ in bucket
        ]
        trainable = sorted(n for n, p in trainer.module.named_parameters() if p.requires_grad)
        if out_dir is not None:
            save_hf_checkpoint(trainer.module, mcfg, out_dir, pg_collection=pg)
        return {
            "before": before,
            "after": after,
            "pushed": pushed,
            "metrics": metrics,
            "trainable": trainable,
            "logprobs": trainer.compute_logprobs(batch),
        }
    finally:
        destroy_parallel()


def _moved(result: dict) -> dict[str, bool]:
    return {name: not torch.equal(result["before"][name], result["after"][name]) for name in result["after"]}


def test_a_step_trains_the_vision_tower_and_projector_and_tp2_agrees(two_ranks, hf_dir) -> None:
    samples = vlm_samples()
    dp2 = two_ranks.run(_train, VLM, {}, hf_dir, None, samples)
    tp2 = two_ranks.run(_train, VLM, {"tensor_parallel": 2}, hf_dir, None, samples)
    moved = _moved(dp2[0])
    for name, changed in moved.items():
        if "post_layernorm" in name:
            assert not changed, name
        elif "vision_tower" in name or "multi_modal_projector" in name:
            assert changed, name
    assert dp2[0]["metrics"]["grad_norm"] > 0
    for rank in (*dp2, *tp2):
        torch.testing.assert_close(rank["logprobs"], dp2[0]["logprobs"], rtol=0, atol=1e-5)
    # Adam's first step moves each weight by about +-lr (1e-3) whatever its gradient's size, so a gradient
    # that is mathematically zero (a key bias: softmax ignores a shift of every key) moves by rounding
    # noise, differently per layout; a wrong gradient would be off by ~lr.
    for name, tensor in dp2[0]["after"].items():
        torch.testing.assert_close(tp2[0]["after"][name], tensor, rtol=0, atol=1e-4, msg=name)


def test_a_frozen_tower_stays_bit_equal_and_is_not_pushed(two_ranks, hf_dir, tmp_path) -> None:
    results = two_ranks.run(_train, FROZEN, {"tensor_parallel": 2}, hf_dir, tmp_path / "frozen", vlm_samples())
    first = results[0]
    for name, changed in _moved(first).items():
        if "vision_tower" in name:
            assert not changed, name
        elif "multi_modal_projector" in name:
            assert changed, name
    assert not any(name.startswith("vision.encoder.") for rank in results for name in rank["trainable"])
    assert not any("vision_tower" in name for name in first["pushed"])
    assert any("multi_modal_projector" in name for name in first["pushed"])
    # the saved checkpoint is whole (tower included) and loads with its processor (written, none was copied)
    import transformers

    saved = read_safetensors(tmp_path / "frozen")
    assert sorted(saved) == sorted(read_safetensors(hf_dir))
    assert type(transformers.AutoProcessor.from_pretrained(tmp_path / "frozen")).__name__ == "LlavaProcessor"
    _hf_model(tmp_path / "frozen")


def _refused(rank: int, world_size: int, layout: dict) -> str:
    from hetrl.trainer.model import build_gpt_model
    from hetrl.trainer.parallel import destroy_parallel, init_parallel

    tcfg = TrainerConfig(precision="fp32", **layout)
    groups = init_parallel(tcfg)
    try:
        build_gpt_model(VLM, tcfg, pg_collection=groups.pg_collection)
        return "built"
    except ValueError as error:
        return str(error)
    finally:
        destroy_parallel()


def test_unsupported_layouts_are_refused_at_build(two_ranks) -> None:
    for layout, what in [
        ({"context_parallel": 2}, "context_parallel"),
        ({"tensor_parallel": 2, "sequence_parallel": True}, "sequence_parallel"),
    ]:
        for message in two_ranks.run(_refused, layout):
            assert "model.arch=llava" in message and what in message, message


def _checkpoint_round_trip(rank: int, world_size: int, hf_dir: Path, root: Path) -> dict:
    """TP=2 trains a step and saves; a DP=2 trainer (another seed) loads it: the same HF tensors."""
    from rank_pool import may_start_processes

    from hetrl.trainer import checkpoint
    from hetrl.trainer.exporter import iter_hf_tensors
    from hetrl.trainer.hf_convert import load_hf_checkpoint
    from hetrl.trainer.parallel import destroy_parallel
    from hetrl.trainer.policy import PolicyTrainer

    def tensors(trainer) -> dict:
        return dict(
            iter_hf_tensors(
                trainer.module, FROZEN.vocab_size, pg_collection=trainer.groups.pg_collection, include_frozen=True
            )
        )

    results = {}
    for name, layout, seed in (("saved", {"tensor_parallel": 2}, 11), ("loaded", {}, 12)):
        trainer = PolicyTrainer(
            FROZEN,
            TrainerConfig(precision="fp32", lr=1e-3, micro_batch_size=2, **layout),
            AlgorithmConfig(name="grpo", group_size=2),
            seed=seed,
            max_len=16,
        )
        try:
            if name == "saved":
                load_hf_checkpoint(trainer.module, hf_dir, trainer.groups.pg_collection)
                trainer.train_step(
                    trainer.make_batch(vlm_samples()).with_advantages(torch.tensor([1.0, -1.0, 0.5, -0.5]))
                )
                with may_start_processes():
                    checkpoint.save_checkpoint(root, 1, trainer.model, trainer.optimizer, trainer.scheduler)
            else:
                checkpoint.load_checkpoint(root, trainer.model, trainer.optimizer, trainer.scheduler, load_rng=False)
            results[name] = tensors(trainer)
        finally:
            destroy_parallel()
    return results


def test_checkpoint_reshards_a_vision_language_policy(two_ranks, hf_dir, tmp_path) -> None:
    """dist_checkpointing saves the encoder's TP shards (and the frozen tower, which has no optimizer state)."""
    results = two_ranks.run(_checkpoint_round_trip, hf_dir, tmp_path / "ckpt")
    saved, loaded = results[0]["saved"], results[0]["loaded"]
    assert sorted(saved) == sorted(loaded) and any("vision_tower" in name for name in saved)
    for name, tensor in saved.items():
        assert torch.equal(loaded[name], tensor), name


def _rl_step(rank: int, world_size: int, hf_dir: Path, layout: dict) -> dict:
    """train_on_batch with PPO (a value model that sees the images too), from the HF checkpoint."""
    from hetrl.config.critic import CriticConfig
    from hetrl.trainer.critic import ValueTrainer
    from hetrl.trainer.hf_convert import load_hf_checkpoint
    from hetrl.trainer.parallel import destroy_parallel
    from hetrl.trainer.policy import PolicyTrainer
    from hetrl.trainer.rl_step import train_on_batch

    ppo = AlgorithmConfig(name="ppo", group_size=2)
    samples = vlm_samples()
    for i, s in enumerate(samples):
        s.reward = float(i % 3) - 0.5
    tcfg = TrainerConfig(precision="fp32", lr=1e-3, micro_batch_size=2, **layout)
    policy = PolicyTrainer(VLM, tcfg, ppo, seed=5, max_len=16)
    critic = ValueTrainer(VLM, tcfg, CriticConfig(lr=1e-2), ppo, policy.groups, seed=5, max_len=16)
    try:
        load_hf_checkpoint(policy.module, hf_dir, policy.groups.pg_collection)
        critic.load_initial_weights("policy", hf_dir)
        batch = policy.make_batch(samples)
        values_before = critic.compute_values(batch)
        metrics, logprobs = train_on_batch(policy, critic, *whole_step(samples), num_minibatches=1, max_tokens=16)
        return {
            "metrics": metrics,
            "logprobs": logprobs,
            "values_before": values_before,
            "values_after": critic.compute_values(batch),
        }
    finally:
        destroy_parallel()


def test_rl_step_returns_logprobs_per_completion_token_and_a_critic_trains(two_ranks, hf_dir) -> None:
    """What the trainer measures the mismatch with and stores: each replica's samples' log-probs in their completion
    alignment (image placeholders one column each), those of the HF model the engines serve."""
    samples = vlm_samples()
    reference = _hf_logprobs(_hf_model(hf_dir), samples)
    for layout in ({}, {"tensor_parallel": 2}):
        ranks = two_ranks.run(_rl_step, hf_dir, layout)
        assert set().union(*(rank["logprobs"] for rank in ranks)) == set(range(len(samples)))
        for rank in ranks:
            for i, row in rank["logprobs"].items():
                assert row.shape == (len(samples[i].completion_ids),)
                torch.testing.assert_close(row, reference[i, : row.shape[0]], rtol=0, atol=1e-5)
            assert rank["metrics"]["loss/value"] > 0
            assert not torch.equal(rank["values_after"], rank["values_before"])
