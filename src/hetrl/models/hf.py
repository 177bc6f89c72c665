"""ModelConfig <-> HF ``config.json``, and random-init HF checkpoints for tiny local models.

The recipe's ``model:`` section is the single description of the architecture; HF configs are
derived from it so that the trainer's Megatron model and the engines' vLLM model cannot disagree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hetrl.config.model import ModelConfig

HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
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
    config = classes[cfg.arch](**hf_config_dict(cfg))
    config.architectures = [HF_ARCHITECTURES[cfg.arch]]
    return config


def build_random_hf_checkpoint(cfg: ModelConfig, out_dir: Path, seed: int = 0, init_std: float = 0.02) -> Path:
    """Write a random-init HF checkpoint (safetensors, fp32) plus the character tokenizer to ``out_dir``.

    This is how tests and the embedded default get "real" checkpoints without a model hub: the same
    loading code then runs on them as on downloaded weights.
    """
    import torch
    import transformers

    from hetrl.models.tokenizer import save_char_tokenizer

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = hf_config(cfg)
    config.initializer_range = init_std
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    model.save_pretrained(out_dir, safe_serialization=True)
    save_char_tokenizer(out_dir, cfg.vocab_size)
    return out_dir
