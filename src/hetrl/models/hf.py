"""ModelConfig <-> HF ``config.json``, and random-init HF checkpoints for tiny local models.

The recipe's ``model:`` section is the single description of the architecture; HF configs are
derived from it so that the trainer's Megatron model and the engines' vLLM model cannot disagree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hetrl.config.model import ModelConfig
from hetrl.models.tokenizer import MIN_VOCAB_SIZE, build_char_tokenizer

# The character tokenizer's <image> token (build_char_tokenizer(image_token=True)): the first id after its characters.
CHAR_IMAGE_TOKEN_ID = MIN_VOCAB_SIZE

HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "llava": "LlavaForConditionalGeneration",
}


def hf_config_dict(cfg: ModelConfig) -> dict[str, Any]:
    """Keyword arguments of the transformers config class of ``cfg.arch``."""
    common: dict[str, Any] = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_query_groups,
        head_dim=cfg.kv_channels,
        intermediate_size=cfg.ffn_hidden_size,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        rms_norm_eps=cfg.norm_epsilon,
        tie_word_embeddings=cfg.tie_word_embeddings,
        hidden_act="silu",
        # The built-in character tokenizer: pad/eos ids, and a tokenizer class transformers can
        # load without a hub (Qwen configs otherwise force a Qwen2 tokenizer class).
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=None,
        tokenizer_class="PreTrainedTokenizerFast",
    )
    if cfg.arch == "qwen3_moe":
        common.update(
            num_experts=cfg.num_experts,
            num_experts_per_tok=cfg.moe_router_topk,
            moe_intermediate_size=cfg.moe_ffn_hidden_size,
            router_aux_loss_coef=cfg.moe_aux_loss_coeff,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    return common


def hf_config(cfg: ModelConfig):
    """The transformers ``PretrainedConfig`` instance for ``cfg``."""
    import transformers

    classes = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "qwen3_moe": transformers.Qwen3MoeConfig,
    }
    if cfg.is_vlm:
        return llava_config(cfg)
    config = classes[cfg.arch](**hf_config_dict(cfg))
    config.architectures = [HF_ARCHITECTURES[cfg.arch]]
    return config


def image_token_id(cfg: ModelConfig) -> int:
    """The id of a vision-language policy's image placeholder: its checkpoint's, else the character tokenizer's."""
    if cfg.hf_checkpoint is not None:
        config = json.loads((Path(cfg.hf_checkpoint) / "config.json").read_text())
        found = config.get("image_token_id", config.get("image_token_index"))
        if found is None:
            raise ValueError(
                f"{cfg.hf_checkpoint}/config.json names no image token (image_token_id / image_token_index): "
                "not a LLaVA-style checkpoint"
            )
        return int(found)
    return CHAR_IMAGE_TOKEN_ID


def llava_config(cfg: ModelConfig):
    """HF ``LlavaConfig`` of a vision-language ``cfg``: CLIP vision tower, Llama text model.

    The features are the last ViT layer's patches (``vision_feature_layer=-1``, class token dropped):
    the layer the trainer's ViT ends with, so it holds no block the policy never uses. The image
    token is the checkpoint's, else the character tokenizer's (:func:`image_token_id`).
    """
    import transformers

    vision = cfg.vision
    text = transformers.LlamaConfig(**hf_config_dict(cfg))
    vision_config = transformers.CLIPVisionConfig(
        hidden_size=vision.hidden_size,
        intermediate_size=vision.ffn_hidden_size,
        num_hidden_layers=vision.num_layers,
        num_attention_heads=vision.num_attention_heads,
        image_size=vision.image_size,
        patch_size=vision.patch_size,
        layer_norm_eps=vision.norm_epsilon,
        hidden_act="quick_gelu",
        projection_dim=cfg.hidden_size,
    )
    config = transformers.LlavaConfig(
        vision_config=vision_config,
        text_config=text,
        image_token_index=image_token_id(cfg),
        image_seq_length=vision.tokens_per_image,
        projector_hidden_act="gelu",
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        multimodal_projector_bias=True,
        tie_word_embeddings=cfg.tie_word_embeddings,
    )
    config.architectures = [HF_ARCHITECTURES["llava"]]
    return config


# transformers 5.19 saves LLaVA under its legacy names; vLLM loads only these (transformers loads both).
_LLAVA_SAVED_TO_SERVED = (
    ("language_model.model.", "model.language_model."),
    ("language_model.lm_head.", "lm_head."),
    ("vision_tower.", "model.vision_tower.vision_model."),
    ("multi_modal_projector.", "model.multi_modal_projector."),
)


def _rename_llava_weights(path: Path) -> None:
    """Rewrite a LLaVA safetensors file under the names vLLM loads (:data:`_LLAVA_SAVED_TO_SERVED`)."""
    from safetensors.torch import load_file, save_file

    def served(name: str) -> str:
        for saved, serving in _LLAVA_SAVED_TO_SERVED:
            if name.startswith(saved):
                return serving + name[len(saved) :]
        raise ValueError(f"unexpected LLaVA tensor name {name!r} in {path}")

    save_file({served(name): tensor for name, tensor in load_file(path).items()}, path, metadata={"format": "pt"})


def save_llava_processor(out_dir: Path, cfg: ModelConfig, tokenizer) -> None:  # noqa: ANN001 - a transformers tokenizer
    """The ``LlavaProcessor`` vLLM and transformers load beside a LLaVA checkpoint.

    Images are resized to the encoder's square (no centre crop: a screenshot's edges matter) and
    normalised with CLIP's statistics; each ``<image>`` in a prompt expands to the image's patches.
    """
    import transformers

    side = cfg.vision.image_size
    image_processor = transformers.CLIPImageProcessor(
        size={"height": side, "width": side},
        do_center_crop=False,
        crop_size={"height": side, "width": side},
    )
    processor = transformers.LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=cfg.vision.patch_size,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=tokenizer.chat_template,
    )
    processor.save_pretrained(out_dir)


def build_random_hf_checkpoint(cfg: ModelConfig, out_dir: Path, seed: int = 0, init_std: float = 0.02) -> Path:
    """Write a random-init HF checkpoint (safetensors, fp32) plus the character tokenizer to ``out_dir``.

    This is how tests and the embedded default get "real" checkpoints without a model hub: the same
    loading code then runs on them as on downloaded weights.
    """
    import torch
    import transformers

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = hf_config(cfg)
    config.initializer_range = init_std
    torch.manual_seed(seed)
    model_class = transformers.AutoModelForImageTextToText if cfg.is_vlm else transformers.AutoModelForCausalLM
    model = model_class.from_config(config, torch_dtype=torch.float32)
    model.save_pretrained(out_dir, safe_serialization=True)
    if cfg.is_vlm:
        _rename_llava_weights(out_dir / "model.safetensors")
    tokenizer = build_char_tokenizer(cfg.vocab_size, image_token=cfg.is_vlm)
    tokenizer.save_pretrained(out_dir)
    if cfg.is_vlm:
        save_llava_processor(out_dir, cfg, tokenizer)
    return out_dir
