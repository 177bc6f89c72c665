"""The vision side of a LLaVA policy: image placeholders, pixel values, the encoder, the merge.

A LLaVA policy (``model.arch=llava``) is the trainer's ``GPTModel`` language model plus, on the
first pipeline stage, a :class:`VisionEncoder`: megatron's ``CLIPViTModel`` (CLIP's pre-norm
LayerNorm blocks with biases, quick-GELU MLP, class token, learned position embeddings, and
*bidirectional* attention) whose last layer's patch features (class token dropped) go through
megatron's ``MultimodalProjector`` (``linear_fc1`` vision -> text width, erf GELU, ``linear_fc2``,
with biases) into the language model's width. This is HF ``LlavaForConditionalGeneration`` with
``vision_feature_layer=-1`` and ``vision_feature_select_strategy="default"``; both towers are tensor
parallel like the language model (column/row splits of qkv, fc1, fc2, proj and the projector).

Who does what with a sample's images (``Sample.images``, one ``<image>`` id per image in its token
ids, the engines' convention):

* **model space** (``hetrl.trainer.batch``): each placeholder becomes ``tokens_per_image`` positions
  of the row (:func:`model_tokens`), in prompt and completion alike (observation turns of a
  multi-turn episode carry screenshots); the micro-batch carries the images' pixel values
  (:func:`pixel_values`, the checkpoint's ``CLIPImageProcessor``) and a mask of the image positions.
  Position ids run over the expanded sequence, as HF and vLLM number them.
* **sample space** is untouched: one column per *original* completion token, so log-probs,
  entropies and values come back aligned with ``Sample.completion_ids`` / ``Sample.logprobs``
  (what the loss, the advantages and the engine-vs-trainer mismatch read). A completion image
  placeholder is an observation token (loss mask 0); its column reads a position no loss uses.
* **forward** (:func:`attach_vision`): the word embeddings of the image positions are replaced by
  the projected patch features, images in order, and ``GPTModel`` runs on that ``decoder_input``.

Importing this module does not import megatron (the batch builder uses its data half).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from hetrl.config.model import ModelConfig
from hetrl.config.trainer import TrainerConfig
from hetrl.models.hf import image_token_id
from hetrl.models.images import to_pil
from hetrl.records import Sample
from hetrl.trainer.norms import TorchNorm

# A parameter that never trains (a frozen vision tower; HF's post_layernorm, which LLaVA never
# uses) carries this attribute: no gradient, no optimizer state, and weight pushes leave it out.
FROZEN_ATTR = "hetrl_frozen"


def is_frozen(param: Tensor) -> bool:
    return bool(getattr(param, FROZEN_ATTR, False))


# --- the data half: placeholders and pixels ---------------------------------------------------


@dataclass(frozen=True)
class ImageSpec:
    """What the batch builder needs to know about a vision-language policy's images."""

    image_token_id: int  # the <image> placeholder id in the token ids (one per image)
    tokens_per_image: int  # positions one image takes in the language model's sequence
    image_size: int  # side of the square the encoder takes (pixels)


def image_spec(model_cfg: ModelConfig) -> ImageSpec | None:
    """The policy's :class:`ImageSpec`; None for a text-only model.

    The placeholder id is the checkpoint's (``model.hf_checkpoint``), else the character tokenizer's
    ``<image>`` (what ``hetrl.models.hf`` writes as a random-init LLaVA's ``image_token_index``).
    """
    if model_cfg.vision is None:
        return None
    return ImageSpec(image_token_id(model_cfg), model_cfg.vision.tokens_per_image, model_cfg.vision.image_size)


@dataclass(frozen=True)
class ModelTokens:
    """A sample's token ids as the model sees them (image placeholders expanded)."""

    ids: list[int]
    completion_at: list[int]  # model position of each original completion token (its first copy for an image)
    image_positions: list[int]  # model positions that take image features, images in order


def model_tokens(sample: Sample, spec: ImageSpec | None) -> ModelTokens:
    """``sample``'s prompt + completion with every image placeholder repeated ``tokens_per_image`` times.

    Checks that the sample has one image per placeholder, and that no placeholder is a policy
    token (loss mask 1): an engine that sampled the image token produced no image for it.
    """
    ids = sample.prompt_ids + sample.completion_ids
    p = len(sample.prompt_ids)
    if spec is None:
        if sample.images:
            raise ValueError(
                f"sample {sample.sample_id} carries {len(sample.images)} images but the policy has no vision encoder "
                "(model.arch=llava with model.vision)"
            )
        return ModelTokens(ids, list(range(p, len(ids))), [])
    placeholders = [k for k, token in enumerate(ids) if token == spec.image_token_id]
    if len(placeholders) != len(sample.images):
        raise ValueError(
            f"sample {sample.sample_id} has {len(placeholders)} image placeholders (id {spec.image_token_id}) "
            f"but {len(sample.images)} images"
        )
    sampled = [k - p for k in placeholders if k >= p and sample.loss_mask[k - p]]
    if sampled:
        raise ValueError(
            f"sample {sample.sample_id}: completion tokens {sampled[:3]} are image placeholders with loss mask 1 "
            "(did the engine sample the image token? it must be banned)"
        )
    expanded: list[int] = []
    at: list[int] = []  # model position of each original token
    image_positions: list[int] = []
    for token in ids:
        at.append(len(expanded))
        copies = spec.tokens_per_image if token == spec.image_token_id else 1
        if copies > 1:
            image_positions.extend(range(len(expanded), len(expanded) + copies))
        expanded.extend([token] * copies)
    return ModelTokens(expanded, at[p:], image_positions)


def model_length(sample: Sample, spec: ImageSpec | None) -> int:
    """Model positions of ``sample`` (prompt + completion, placeholders expanded), without building them."""
    n = len(sample.prompt_ids) + len(sample.completion_ids)
    if spec is None:
        return n
    return n + len(sample.images) * (spec.tokens_per_image - 1)


@functools.lru_cache(maxsize=4)
def _image_processor(image_size: int):  # -> transformers CLIPImageProcessor
    import transformers

    # The arguments of hetrl.models.hf.save_llava_processor: resize to the square, no centre crop,
    # CLIP's mean/std. transformers picks its backend (PIL, or torchvision where installed) as the
    # engines' processor loading does, so both see the same pixels.
    return transformers.CLIPImageProcessor(
        size={"height": image_size, "width": image_size},
        do_center_crop=False,
        crop_size={"height": image_size, "width": image_size},
    )


def pixel_values(images: Sequence[Any], spec: ImageSpec) -> Tensor:
    """``[n, 3, S, S]`` float32 pixel values of PIL images or encoded bytes (``hetrl.models.images.to_pil``)."""
    if not images:
        return torch.zeros(0, 3, spec.image_size, spec.image_size)
    out = _image_processor(spec.image_size)(images=[to_pil(image) for image in images], return_tensors="pt")[
        "pixel_values"
    ]
    return out.float()


# --- the model half: encoder, merge -----------------------------------------------------------


def _quick_gelu(x: Tensor) -> Tensor:
    """CLIP's activation (HF ``quick_gelu``)."""
    return x * torch.sigmoid(1.702 * x)


class BidirectionalAttention(torch.nn.Module):
    """Core attention of the ViT blocks: every patch attends to every patch (no mask), torch SDPA.

    megatron's local ViT spec is causal by default, which CLIP is not (logits then differ by ~0.2).
    Same constructor and ``forward`` as megatron's ``DotProductAttention``; ``[s, b, heads, d]`` in,
    ``[s, b, heads * d]`` out. No context parallelism or packing: an image is one short sequence.
    """

    def __init__(
        self,
        config: Any,
        layer_number: int,
        attn_mask_type: Any,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
    ) -> None:
        super().__init__()
        if attn_mask_type.name != "no_mask":
            raise ValueError(f"BidirectionalAttention takes no mask; got attn_mask_type={attn_mask_type.name}")
        self.softmax_scale = softmax_scale or 1.0 / math.sqrt(config.kv_channels)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> Tensor:
        if attention_mask is not None or attention_bias is not None or packed_seq_params is not None:
            raise ValueError("BidirectionalAttention attends whole images: no mask, bias or packing")
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
        out = F.scaled_dot_product_attention(q, k, v, scale=self.softmax_scale)
        return out.permute(2, 0, 1, 3).reshape(query.shape[0], query.shape[1], -1)


def vision_transformer_config(model_cfg: ModelConfig, trainer_cfg: TrainerConfig):  # -> TransformerConfig
    """megatron config of the ViT: the vision shape, the trainer's TP and precision, one pipeline stage."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    vision = model_cfg.vision
    dtype = torch.bfloat16 if trainer_cfg.precision == "bf16" else torch.float32
    return TransformerConfig(
        num_layers=vision.num_layers,
        hidden_size=vision.hidden_size,
        ffn_hidden_size=vision.ffn_hidden_size,
        num_attention_heads=vision.num_attention_heads,
        num_query_groups=vision.num_attention_heads,
        kv_channels=vision.hidden_size // vision.num_attention_heads,
        normalization="LayerNorm",
        layernorm_epsilon=vision.norm_epsilon,
        gated_linear_unit=False,
        activation_func=_quick_gelu,
        add_bias_linear=True,
        add_qkv_bias=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=0.02,
        tensor_model_parallel_size=trainer_cfg.tensor_parallel,
        pipeline_model_parallel_size=1,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        use_cpu_initialization=True,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
    )


def _projector_config(vit_config, model_cfg: ModelConfig):  # noqa: ANN001, ANN202 - megatron configs
    """The projector's MLP: vision width -> text width (``ffn_hidden_size``) -> text width, erf GELU, biases."""
    from dataclasses import replace

    # (attention shapes are unused by an MLP; the text model's pass megatron's TP divisibility checks)
    return replace(
        vit_config,
        num_layers=1,
        hidden_size=model_cfg.hidden_size,
        ffn_hidden_size=model_cfg.hidden_size,
        num_attention_heads=model_cfg.num_attention_heads,
        num_query_groups=model_cfg.num_query_groups,
        kv_channels=model_cfg.kv_channels,
        activation_func=F.gelu,
    )


def _vit_layer_spec():  # -> megatron ModuleSpec
    """megatron's local ViT block with hetrl's LayerNorm (with bias, config-aware) and bidirectional attention."""
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.mlp import MLP, MLPSubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

    attention = ModuleSpec(
        module=SelfAttention,
        params={"attn_mask_type": AttnMaskType.no_mask},
        submodules=SelfAttentionSubmodules(
            linear_qkv=ColumnParallelLinear, core_attention=BidirectionalAttention, linear_proj=RowParallelLinear
        ),
    )
    mlp = ModuleSpec(
        module=MLP, submodules=MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
    )
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=TorchNorm,
            self_attention=attention,
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=TorchNorm,
            mlp=mlp,
            mlp_bda=get_bias_dropout_add,
        ),
    )


class VisionEncoder(torch.nn.Module):
    """CLIP ViT + projector: pixel values ``[n, 3, S, S]`` -> image embeddings ``[n, tokens_per_image, text hidden]``.

    ``post_layernorm`` holds HF's ``vision_model.post_layernorm`` (it norms the class token of the
    last layer, which LLaVA never reads): imported and exported so that a checkpoint round-trips
    exactly, never trained, never pushed. A plain module whose checkpoint state is its megatron
    children's (TP-sharded) plus the replicated ``post_layernorm``.
    """

    def __init__(self, model_cfg: ModelConfig, trainer_cfg: TrainerConfig, pg_collection: Any) -> None:
        from megatron.core.models.vision.clip_vit_model import CLIPViTModel
        from megatron.core.models.vision.multimodal_projector import MultimodalProjector
        from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
        from megatron.core.transformer.mlp import MLPSubmodules

        super().__init__()
        vision = model_cfg.vision
        self.tp_group = pg_collection.tp  # replicated tensors' checkpoint replica ids count TP ranks
        config = vision_transformer_config(model_cfg, trainer_cfg)
        self.encoder = CLIPViTModel(
            config,
            _vit_layer_spec(),
            ln_pre_impl=TorchNorm,
            add_class_token=True,
            class_token_len=1,
            patch_dim=vision.patch_size,
            img_h=vision.image_size,
            img_w=vision.image_size,
            model_subtype="clip",
            pg_collection=pg_collection,
        )
        self.projector = MultimodalProjector(
            _projector_config(config, model_cfg),
            MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
            projector_type="mlp",
            input_size=vision.hidden_size,
            tp_group=pg_collection.tp,
        )
        self.post_layernorm = torch.nn.LayerNorm(vision.hidden_size, eps=vision.norm_epsilon, dtype=config.params_dtype)
        for param in self.post_layernorm.parameters():
            param.requires_grad_(False)
            setattr(param, FROZEN_ATTR, True)
        if vision.freeze:
            freeze_tower(self)

    def forward(self, pixels: Tensor) -> Tensor:
        weight = self.encoder.conv1.weight
        features = self.encoder(pixels.to(device=weight.device, dtype=weight.dtype))  # [n, 1 + patches, vision hidden]
        return self.projector(features[:, 1:].contiguous())  # the class token dropped ("default" strategy)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> dict:
        from megatron.core.transformer.utils import sharded_state_dict_default

        out = {}
        for name, child in self.named_children():
            out.update(
                sharded_state_dict_default(child, f"{prefix}{name}.", sharded_offsets, metadata, tp_group=self.tp_group)
            )
        return out


def freeze_tower(encoder: VisionEncoder) -> None:
    """``model.vision.freeze``: the ViT keeps its weights (no gradient, no optimizer state, not pushed)."""
    for param in encoder.encoder.parameters():
        param.requires_grad_(False)
        setattr(param, FROZEN_ATTR, True)


def check_layout(model_cfg: ModelConfig, trainer_cfg: TrainerConfig) -> None:
    """Refuse the trainer layouts a vision-language policy does not support (ValueError).

    Context and sequence parallelism would hand the merge a slice of each row (the embeddings are
    split before the image positions could be filled). Expert parallelism is refused for every
    dense model (``build_gpt_model``).
    """
    vision, tp = model_cfg.vision, trainer_cfg.tensor_parallel
    refused = {
        "trainer.context_parallel > 1": trainer_cfg.context_parallel > 1,
        "trainer.sequence_parallel": trainer_cfg.sequence_parallel,
    }
    for what, present in refused.items():
        if present:
            raise ValueError(f"model.arch=llava (vision-language policy) does not support {what}")
    for name, size in (
        ("model.vision.num_attention_heads", vision.num_attention_heads),
        ("model.vision.ffn_hidden_size", vision.ffn_hidden_size),
        ("model.hidden_size", model_cfg.hidden_size),
    ):
        if size % tp:
            raise ValueError(
                f"{name}={size} is not divisible by trainer.tensor_parallel={tp} (the vision encoder is tensor "
                f"parallel)"
            )


def attach_vision(
    model: torch.nn.Module, model_cfg: ModelConfig, trainer_cfg: TrainerConfig, pg_collection: Any
) -> None:
    """Make a ``GPTModel`` (any pipeline stage) the language model of a LLaVA policy, in place.

    Every stage gets ``hf_layout = "llava"`` (its HF names are LLaVA's). The first stage also gets
    ``model.vision`` (:class:`VisionEncoder`) and a forward pre-hook that takes two more keyword
    arguments: ``images`` (pixel values ``[n, 3, S, S]``) and ``image_mask`` (bool ``[b, s]``, the
    positions of ``input_ids`` that take the ``n * tokens_per_image`` image embeddings, in
    row-major order), and turns them into ``decoder_input``. Other stages drop them.
    """
    model.hf_layout = "llava"
    if model.pre_process:
        model.vision = VisionEncoder(model_cfg, trainer_cfg, pg_collection)
    model.register_forward_pre_hook(_merge_images, with_kwargs=True)


def _merge_images(model: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    images, image_mask = kwargs.pop("images", None), kwargs.pop("image_mask", None)
    if images is None or not model.pre_process:
        return args, kwargs
    if kwargs.get("decoder_input") is not None:
        raise ValueError("pass either images or decoder_input, not both")
    input_ids, position_ids = args[0], args[1]
    embeddings = model.embedding(input_ids=input_ids, position_ids=position_ids)  # [s, b, h]
    kwargs["decoder_input"] = merge_image_embeddings(embeddings, image_mask.to(embeddings.device), model.vision(images))
    return args, kwargs


def merge_image_embeddings(embeddings: Tensor, image_mask: Tensor, features: Tensor) -> Tensor:
    """``embeddings`` ``[s, b, h]`` with the positions of ``image_mask`` ``[b, s]`` (row-major order) replaced
    by ``features`` ``[n, tokens_per_image, h]``, image after image. Differentiable in both."""
    hidden = embeddings.shape[-1]
    flat = features.reshape(-1, hidden)
    if int(image_mask.sum()) != flat.shape[0]:
        raise ValueError(
            f"{int(image_mask.sum())} image positions for {features.shape[0]} images of {features.shape[1]} embeddings"
        )
    merged = embeddings.transpose(0, 1).clone()
    merged[image_mask] = flat.to(merged.dtype)
    return merged.transpose(0, 1).contiguous()
