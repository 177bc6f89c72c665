"""``model:`` — the policy architecture (and where its weights and tokenizer come from).

The same section describes the Megatron-core model the trainer builds and the HF checkpoint the
engines serve, so that the two agree on every shape the planner checks.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from hetrl.config.base import Section

Architecture = Literal["llama", "qwen2", "qwen3", "qwen3_moe"]


class ModelConfig(Section):
    arch: Architecture = Field("llama", description="HF layout family: llama, qwen2 (qkv bias), qwen3 (qk-norm), qwen3_moe (qk-norm + MoE MLPs).")
    hf_checkpoint: str | None = Field(
        None, description="Path of an HF checkpoint directory (safetensors + config + tokenizer) to start from; null builds a random-init model of the shape below."
    )
    tokenizer: str | None = Field(
        None, description="Tokenizer directory; null uses hf_checkpoint's, or the built-in character tokenizer for random-init models."
    )
    vocab_size: int = Field(128, ge=8, description="Vocabulary size (padded to a multiple of the trainer's tensor-parallel size).")
    hidden_size: int = Field(128, ge=8, description="Model width.")
    num_layers: int = Field(2, ge=1, description="Number of transformer blocks.")
    num_attention_heads: int = Field(4, ge=1, description="Query heads.")
    num_query_groups: int = Field(2, ge=1, description="Key/value heads (GQA groups); must divide num_attention_heads.")
    head_dim: int | None = Field(None, ge=8, description="Per-head width; null means hidden_size / num_attention_heads.")
    ffn_hidden_size: int = Field(256, ge=8, description="SwiGLU MLP width of dense blocks.")
    max_position_embeddings: int = Field(512, ge=16, description="Context length the model supports (prompt + response).")
    rope_theta: float = Field(10000.0, gt=0.0, description="RoPE base frequency.")
    norm_epsilon: float = Field(1e-6, gt=0.0, description="RMSNorm epsilon.")
    tie_word_embeddings: bool = Field(False, description="Share input embedding and output projection.")
    num_experts: int | None = Field(None, ge=2, description="MoE: experts per MoE block (qwen3_moe only).")
    moe_router_topk: int = Field(2, ge=1, description="MoE: experts each token is routed to.")
    moe_ffn_hidden_size: int | None = Field(None, ge=8, description="MoE: width of each expert's MLP.")
    moe_aux_loss_coeff: float = Field(1e-3, ge=0.0, description="MoE: load-balancing auxiliary loss weight.")

    @model_validator(mode="after")
    def _check_shapes(self) -> "ModelConfig":
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(
                f"model.num_attention_heads={self.num_attention_heads} must be a multiple of model.num_query_groups={self.num_query_groups}"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"model.hidden_size={self.hidden_size} is not divisible by model.num_attention_heads={self.num_attention_heads}; set model.head_dim"
            )
        is_moe = self.arch == "qwen3_moe"
        if is_moe and (self.num_experts is None or self.moe_ffn_hidden_size is None):
            raise ValueError("model.arch=qwen3_moe needs model.num_experts and model.moe_ffn_hidden_size")
        if not is_moe and self.num_experts is not None:
            raise ValueError(f"model.num_experts is set but model.arch={self.arch!r} is dense; use arch=qwen3_moe")
        if is_moe and self.moe_router_topk > self.num_experts:
            raise ValueError(f"model.moe_router_topk={self.moe_router_topk} exceeds model.num_experts={self.num_experts}")
        if is_moe and self.moe_router_topk == 1:
            # Megatron refuses top-1 softmax routing (a softmax over one logit has no gradient); its
            # pre-softmax alternative would weight the expert unlike the HF Qwen3-MoE the engines serve.
            raise ValueError("model.moe_router_topk=1: Megatron's softmax router needs at least 2 experts per token; use moe_router_topk >= 2")
        return self

    @property
    def kv_channels(self) -> int:
        """Per-head width after applying the default."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.arch == "qwen3_moe"
