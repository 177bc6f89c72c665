"""``model:`` — the policy architecture (and where its weights and tokenizer come from).

The same section describes the Megatron-core model the trainer builds and the HF checkpoint the
engines serve, so that the two agree on every shape the planner checks.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from hetrl.config.base import Section

Architecture = Literal["llama", "qwen2", "qwen3", "qwen3_moe", "llava"]


class VisionConfig(Section):
    """``model.vision:`` the image encoder of a vision-language policy (``model.arch=llava``).

    LLaVA's layout: a CLIP ViT (pre-norm LayerNorm blocks with biases, quick-GELU MLP, a class
    token and learned position embeddings) whose last layer's patch features (class token dropped)
    go through a two-layer GELU MLP projector into the language model's width. Each image becomes
    ``(image_size / patch_size) ** 2`` embeddings in the language model's sequence.
    """

    image_size: int = Field(
        64, ge=8, description="Side of the square image the encoder takes (pixels); images are resized to it."
    )
    patch_size: int = Field(16, ge=1, description="Side of a ViT patch (pixels); image_size must be a multiple of it.")
    hidden_size: int = Field(64, ge=8, description="ViT width.")
    num_layers: int = Field(2, ge=1, description="ViT blocks.")
    num_attention_heads: int = Field(
        2, ge=1, description="ViT attention heads (head width hidden_size / heads; vLLM's CPU kernels want 32 or more)."
    )
    ffn_hidden_size: int = Field(128, ge=8, description="ViT MLP width.")
    norm_epsilon: float = Field(1e-5, gt=0.0, description="ViT LayerNorm epsilon.")
    freeze: bool = Field(
        False,
        description="Keep the vision tower (ViT) at its initial weights: no gradients, and weight pushes leave it "
        "out. The projector still trains.",
    )

    @model_validator(mode="after")
    def _check_shapes(self) -> VisionConfig:
        if self.image_size % self.patch_size:
            raise ValueError(
                f"model.vision.image_size={self.image_size} is not a multiple of "
                f"model.vision.patch_size={self.patch_size}"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"model.vision.hidden_size={self.hidden_size} is not divisible by "
                f"model.vision.num_attention_heads={self.num_attention_heads}"
            )
        return self

    @property
    def tokens_per_image(self) -> int:
        """Language-model positions one image takes (its patches; the class token is dropped)."""
        return (self.image_size // self.patch_size) ** 2


class ModelConfig(Section):
    arch: Architecture = Field(
        "llama",
        description="HF layout family: llama, qwen2 (qkv bias), qwen3 (qk-norm), qwen3_moe (qk-norm + MoE MLPs), "
        "llava (a llama language model that sees images through model.vision).",
    )
    hf_checkpoint: str | None = Field(
        None,
        description="Path of an HF checkpoint directory (safetensors + config + tokenizer) to start from; null builds "
        "a random-init model of the shape below.",
    )
    tokenizer: str | None = Field(
        None,
        description="Tokenizer directory; null uses hf_checkpoint's, or the built-in character tokenizer for "
        "random-init models.",
    )
    vocab_size: int = Field(
        128, ge=8, description="Vocabulary size (padded to a multiple of the trainer's tensor-parallel size)."
    )
    hidden_size: int = Field(128, ge=8, description="Model width.")
    num_layers: int = Field(2, ge=1, description="Number of transformer blocks.")
    num_attention_heads: int = Field(4, ge=1, description="Query heads.")
    num_query_groups: int = Field(2, ge=1, description="Key/value heads (GQA groups); must divide num_attention_heads.")
    head_dim: int | None = Field(
        None, ge=8, description="Per-head width; null means hidden_size / num_attention_heads."
    )
    ffn_hidden_size: int = Field(256, ge=8, description="SwiGLU MLP width of dense blocks.")
    max_position_embeddings: int = Field(
        512, ge=16, description="Context length the model supports (prompt + response)."
    )
    rope_theta: float = Field(10000.0, gt=0.0, description="RoPE base frequency.")
    norm_epsilon: float = Field(1e-6, gt=0.0, description="RMSNorm epsilon.")
    tie_word_embeddings: bool = Field(False, description="Share input embedding and output projection.")
    num_experts: int | None = Field(None, ge=2, description="MoE: experts per MoE block (qwen3_moe only).")
    moe_router_topk: int = Field(2, ge=1, description="MoE: experts each token is routed to.")
    moe_ffn_hidden_size: int | None = Field(None, ge=8, description="MoE: width of each expert's MLP.")
    moe_aux_loss_coeff: float = Field(1e-3, ge=0.0, description="MoE: load-balancing auxiliary loss weight.")
    vision: VisionConfig | None = Field(
        None, description="The image encoder of a vision-language policy; set exactly when arch=llava."
    )

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelConfig:
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(
                f"model.num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"model.num_query_groups={self.num_query_groups}"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"model.hidden_size={self.hidden_size} is not divisible by "
                f"model.num_attention_heads={self.num_attention_heads}; set model.head_dim"
            )
        if (self.arch == "llava") != (self.vision is not None):
            raise ValueError(
                "model.arch=llava needs model.vision (the image encoder), and model.vision needs model.arch=llava"
            )
        is_moe = self.arch == "qwen3_moe"
        if is_moe and (self.num_experts is None or self.moe_ffn_hidden_size is None):
            raise ValueError("model.arch=qwen3_moe needs model.num_experts and model.moe_ffn_hidden_size")
        if not is_moe and self.num_experts is not None:
            raise ValueError(f"model.num_experts is set but model.arch={self.arch!r} is dense; use arch=qwen3_moe")
        if is_moe and self.moe_router_topk > self.num_experts:
            raise ValueError(
                f"model.moe_router_topk={self.moe_router_topk} exceeds model.num_experts={self.num_experts}"
            )
        if is_moe and self.moe_router_topk == 1:
            # Megatron refuses top-1 softmax routing (a softmax over one logit has no gradient); its
            # pre-softmax alternative would weight the expert unlike the HF Qwen3-MoE the engines serve.
            raise ValueError(
                "model.moe_router_topk=1: Megatron's softmax router needs at least 2 experts per token; use "
                "moe_router_topk >= 2"
            )
        return self

    @property
    def kv_channels(self) -> int:
        """Per-head width after applying the default."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.arch == "qwen3_moe"

    @property
    def is_vlm(self) -> bool:
        """A vision-language policy: images in its prompts become embeddings in its sequence."""
        return self.vision is not None
