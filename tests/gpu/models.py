"""The tiny model the GPU checks build: the trainer's and the colocated engine's."""

from hetrl.config.model import ModelConfig

# head_dim 32, as the engines' kernels want; vocab a multiple of 8 for bf16 GEMMs.
MODEL = ModelConfig(
    arch="qwen3",
    hidden_size=128,
    num_layers=2,
    num_attention_heads=4,
    num_query_groups=2,
    ffn_hidden_size=256,
    vocab_size=128,
)
