"""Build the policy as a megatron-core ``GPTModel`` from the recipe's ``model:`` and ``trainer:``.

One function, :func:`build_gpt_model`, maps the HF layout families we support onto megatron's
knobs (the HF importer in ``hf_convert.py`` relies on exactly this mapping):

=========  ==================================================================================
llama      RoPE (rotate-half), RMSNorm, SwiGLU MLP, GQA, no biases
qwen2      llama + bias on the fused QKV projection
qwen3      llama + RMSNorm on each query/key head (qk-norm)
qwen3_moe  qwen3 with every MLP a top-k routed mixture of experts (softmax over the top-k router
           logits, i.e. HF ``norm_topk_prob=True``), load-balancing aux loss, expert parallelism
llava      a llama language model plus, on the first pipeline stage, a CLIP ViT and an MLP
           projector whose image embeddings replace the image positions' word embeddings
           (``hetrl.trainer.vision``); no context, sequence or expert parallelism
=========  ==================================================================================

The layer implementation is megatron's local spec on CPU and transformer-engine's on GPU when it
is installed (``trainer.transformer_impl``); the local spec's core attention is ours
(``hetrl.trainer.context_parallel.AllGatherAttention``: torch's scaled-dot-product attention,
fused kernels where no mask is needed, and context parallelism, which megatron's local attention
lacks), and so are its norms (:class:`TorchNorm`: torch's, with sequence parallelism, which
megatron's local norm refuses and its MoE layers need under TP). The model is built for this rank's pipeline stage
(``pre_process``/``post_process``) and shards (TP/EP), on this rank's device, in the trainer's
precision.

Random initialisation is layout-independent: each parameter's *full* tensor is drawn from a
generator seeded by ``(seed, its global name)`` (global layer and expert numbers), and each rank
keeps its TP/EP shard of it, the way megatron's CPU initialiser splits (strides included). So any
TP/PP/EP layout built with the same seed holds the same model: layouts can be compared exactly,
and a checkpoint resharded to another layout matches a fresh build of that layout.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import replace

import torch
import torch.nn.functional as F

from hetrl.config.model import ModelConfig
from hetrl.config.trainer import TrainerConfig
from hetrl.trainer import megatron_compat, shared_prompts, vision
from hetrl.trainer.context_parallel import AllGatherAttention
from hetrl.trainer.norms import HeadNorm, TorchNorm
from hetrl.trainer.swiglu import SwiGLU

# HF initialiser_range of Llama/Qwen configs; random-init models should look like theirs.
_INIT_STD = 0.02


def padded_vocab_size(model_cfg: ModelConfig, tensor_parallel: int) -> int:
    """Vocabulary rows the embedding holds: ``vocab_size`` rounded up to a multiple of TP.

    Megatron shards the vocabulary evenly across TP ranks. Rows past ``vocab_size`` never hold a
    target token; callers that compare with HF logits slice ``[..., :vocab_size]``.
    """
    return -(-model_cfg.vocab_size // tensor_parallel) * tensor_parallel


def use_transformer_engine(trainer_cfg: TrainerConfig) -> bool:
    """Whether to build the transformer-engine spec (GPU + TE installed, unless forced local).

    Shared prompts need hetrl's own attention (a tree mask) and unfused RoPE: the local spec.
    """
    if trainer_cfg.transformer_impl == "local" or trainer_cfg.shared_prompts:
        return False
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        have_te = False
    else:
        have_te = torch.cuda.is_available()
    if trainer_cfg.transformer_impl == "transformer_engine" and not have_te:
        raise RuntimeError("trainer.transformer_impl=transformer_engine needs a GPU and the transformer_engine package")
    return have_te


def transformer_config(model_cfg: ModelConfig, trainer_cfg: TrainerConfig, *, local_spec: bool):  # -> TransformerConfig
    """The megatron ``TransformerConfig`` of this model under this trainer layout, for the local layer
    spec or transformer-engine's (``local_spec``: see :func:`use_transformer_engine`)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    on_gpu = torch.cuda.is_available()
    dtype = torch.bfloat16 if trainer_cfg.precision == "bf16" else torch.float32
    moe = {}
    if model_cfg.is_moe:
        moe = dict(
            num_moe_experts=model_cfg.num_experts,
            moe_router_topk=model_cfg.moe_router_topk,
            moe_ffn_hidden_size=model_cfg.moe_ffn_hidden_size,
            moe_aux_loss_coeff=model_cfg.moe_aux_loss_coeff,
            moe_router_load_balancing_type="aux_loss",
            moe_token_dispatcher_type="alltoall",
            moe_grouped_gemm=on_gpu,  # the local spec's SequentialMLP on CPU
            moe_router_dtype="fp32",
        )
    return TransformerConfig(
        num_layers=model_cfg.num_layers,
        hidden_size=model_cfg.hidden_size,
        ffn_hidden_size=model_cfg.ffn_hidden_size,
        num_attention_heads=model_cfg.num_attention_heads,
        num_query_groups=model_cfg.num_query_groups,
        kv_channels=model_cfg.kv_channels,
        normalization="RMSNorm",
        layernorm_epsilon=model_cfg.norm_epsilon,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=model_cfg.arch == "qwen2",
        qk_layernorm=model_cfg.arch in ("qwen3", "qwen3_moe"),
        hidden_dropout=0.0,  # RL fine-tuning: dropout would make trainer and engine log-probs disagree
        attention_dropout=0.0,
        init_method_std=_INIT_STD,
        tensor_model_parallel_size=trainer_cfg.tensor_parallel,
        pipeline_model_parallel_size=trainer_cfg.pipeline_parallel,
        expert_model_parallel_size=trainer_cfg.expert_parallel,
        context_parallel_size=trainer_cfg.context_parallel,
        sequence_parallel=trainer_cfg.sequence_parallel,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        # megatron's own init runs too: it is what tags parameters with their TP split (clip-grad and
        # checkpoint code read those tags); init_layout_independent then redraws every value.
        use_cpu_initialization=True,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=on_gpu,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
        # The local spec's dense MLPs take hetrl's SwiGLU module (see _local_block_spec), which megatron
        # calls through this flag, transformer-engine or not.
        use_te_activation_func=local_spec and not model_cfg.is_moe,
        recompute_granularity="full" if trainer_cfg.recompute_activations else None,
        recompute_method="uniform" if trainer_cfg.recompute_activations else None,
        recompute_num_layers=1 if trainer_cfg.recompute_activations else None,
        **moe,
    )


def build_gpt_model(
    model_cfg: ModelConfig,
    trainer_cfg: TrainerConfig,
    *,
    pg_collection: object | None = None,
    seed: int = 1234,
    pre_process: bool | None = None,
    post_process: bool | None = None,
    value_head: bool = False,
):  # -> megatron.core.models.gpt.GPTModel
    """The policy's ``GPTModel`` for this rank (its pipeline stage and TP/EP shards).

    ``value_head`` builds PPO's value model instead: the same network whose last stage ends in a
    :class:`ValueHead` (one scalar per position) rather than the vocabulary projection.

    Needs the megatron process groups (``hetrl.trainer.parallel.init_parallel``). ``seed`` seeds
    megatron's tensor-parallel RNG streams and the CPU generator the full weights are drawn from:
    ranks of any layout that share a seed build the same full model. ``pre_process`` and
    ``post_process`` default to "this rank is the first/last pipeline stage".
    """
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    megatron_compat.ensure_applied()
    if not ps.model_parallel_is_initialized():
        raise RuntimeError(
            "build_gpt_model needs the trainer process groups: call hetrl.trainer.parallel.init_parallel first"
        )
    if model_cfg.num_layers % trainer_cfg.pipeline_parallel:
        raise ValueError(
            f"model.num_layers={model_cfg.num_layers} is not divisible by "
            f"trainer.pipeline_parallel={trainer_cfg.pipeline_parallel}"
        )
    if model_cfg.is_moe and model_cfg.num_experts % trainer_cfg.expert_parallel:
        raise ValueError(
            f"model.num_experts={model_cfg.num_experts} is not divisible by "
            f"trainer.expert_parallel={trainer_cfg.expert_parallel}"
        )
    if trainer_cfg.expert_parallel > 1 and not model_cfg.is_moe:
        raise ValueError(
            f"trainer.expert_parallel={trainer_cfg.expert_parallel} needs an MoE model (model.arch=qwen3_moe)"
        )

    if model_cfg.is_vlm:
        vision.check_layout(model_cfg, trainer_cfg)

    with_te = use_transformer_engine(trainer_cfg)
    config = transformer_config(model_cfg, trainer_cfg, local_spec=not with_te)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    block_spec = get_gpt_decoder_block_spec(
        config,
        use_transformer_engine=with_te,
        normalization="RMSNorm",
        pp_rank=ps.get_pipeline_model_parallel_rank(),
    )
    if not with_te:
        block_spec = _local_block_spec(block_spec, AllGatherAttention)
    model = GPTModel(
        config=config,
        transformer_layer_spec=block_spec,
        vocab_size=padded_vocab_size(model_cfg, trainer_cfg.tensor_parallel),
        max_sequence_length=model_cfg.max_position_embeddings,
        pre_process=ps.is_pipeline_first_stage() if pre_process is None else pre_process,
        post_process=ps.is_pipeline_last_stage() if post_process is None else post_process,
        parallel_output=True,  # logits stay vocab-sharded: log-probs never gather the vocab
        share_embeddings_and_output_weights=model_cfg.tie_word_embeddings and not value_head,
        position_embedding_type="rope",
        rotary_base=int(model_cfg.rope_theta),
        pg_collection=pg_collection,
    )
    if trainer_cfg.shared_prompts:
        shared_prompts.rotary_follows_positions(model)
    if value_head and model.post_process:
        model.output_layer = ValueHead(
            config.hidden_size, trainer_cfg.sequence_parallel, model.pg_collection.tp, config.params_dtype
        )
    if model_cfg.is_vlm:
        vision.attach_vision(model, model_cfg, trainer_cfg, model.pg_collection)
    init_layout_independent(model, model_cfg, trainer_cfg, seed)
    if model.post_process and not value_head and not trainer_cfg.sequence_parallel:
        _batch_first_logits(model.output_layer)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    return model.to(device)


class ValueHead(torch.nn.Module):
    """PPO's value head in place of ``GPTModel.output_layer``: ``V = h w + b`` per position, ``[s, b, 1]``.

    The weight ``[1, hidden]`` and bias ``[1]`` are replicated on every tensor-parallel rank (one
    output cannot be split), laid out as HF's ``score`` head of a token-classification model. It takes the output
    layer's call (``weight`` and ``runtime_gather_output`` are the vocabulary projection's and are
    ignored) and returns ``(values, None)`` like it. Under sequence parallelism it first gathers
    the sequence, so every TP rank computes every position's value (and the same gradient).
    """

    # noqa: ANN001 - a ProcessGroup
    def __init__(self, hidden_size: int, sequence_parallel: bool, tp_group, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(1, hidden_size, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(1, dtype=dtype))
        self.sequence_parallel, self.tp_group = sequence_parallel, tp_group

    def forward(
        self, hidden_states: torch.Tensor, weight: torch.Tensor | None = None, runtime_gather_output: bool | None = None
    ):  # noqa: ANN201
        if self.sequence_parallel:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            # Every TP rank then computes the same loss from the whole sequence, so each already holds
            # the full gradient: the backward keeps its own chunk (no reduce-scatter, which would add
            # tp identical copies).
            hidden_states = gather_from_sequence_parallel_region(
                hidden_states, tensor_parallel_output_grad=False, group=self.tp_group
            )
        return torch.nn.functional.linear(hidden_states, self.weight, self.bias), None


def _batch_first_logits(output_layer: torch.nn.Module) -> None:
    """Make the output layer write its logits batch-first, so that no copy of them is ever made.

    ``GPTModel`` returns ``logits.transpose(0, 1).contiguous()``: a copy of the largest activation
    of the step (``[s, b, V/tp]``), and another in backward, ~7% of a CPU training step. Here the
    output layer gets the (vocabulary-times smaller) hidden states batch-first and hands back a
    sequence-first *view* of its batch-first result, whose transpose is already contiguous. Only
    the layout changes, never a value. Not under sequence parallelism, whose gather runs along the
    sequence dimension of the output layer's input.
    """

    def batch_first_input(module, args, kwargs):  # noqa: ANN001, ANN202 - torch hook signature
        return (args[0].transpose(0, 1).contiguous(), *args[1:]), kwargs

    def sequence_first_view(module, args, output):  # noqa: ANN001, ANN202 - torch hook signature
        logits, bias = output
        return logits.transpose(0, 1), bias

    output_layer.register_forward_pre_hook(batch_first_input, with_kwargs=True)
    output_layer.register_forward_hook(sequence_first_view)


def _local_block_spec(block_spec, core_attention: type):  # noqa: ANN001, ANN202 - megatron spec types
    """The local block spec with hetrl's core attention, norms and SwiGLU (specs are shared: copy, never mutate).

    megatron's local ``DotProductAttention`` refuses context parallelism and does not use torch's
    scaled-dot-product attention; :class:`hetrl.trainer.context_parallel.AllGatherAttention` does both.
    Its torch norm refuses sequence parallelism (which megatron's MoE layers need under TP); every
    norm becomes a :class:`TorchNorm` (:class:`HeadNorm` for qk-norm), which allows it. A dense MLP's
    activation is :class:`hetrl.trainer.swiglu.SwiGLU` (no copy of the gradient in backward).
    """
    from megatron.core.transformer.mlp import MLP
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    def norm(spec, local: type):  # noqa: ANN001, ANN202
        return local if spec is WrappedTorchNorm else spec

    def swap(layer_spec):  # noqa: ANN001, ANN202
        layer = layer_spec.submodules
        attention = layer.self_attention
        attention = replace(
            attention,
            submodules=replace(
                attention.submodules,
                core_attention=core_attention,
                q_layernorm=norm(attention.submodules.q_layernorm, HeadNorm),
                k_layernorm=norm(attention.submodules.k_layernorm, HeadNorm),
            ),
        )
        mlp = layer.mlp
        if mlp.module is MLP:  # dense (an MoE layer's experts keep megatron's activation)
            mlp = replace(mlp, submodules=replace(mlp.submodules, activation_func=SwiGLU))
        return replace(
            layer_spec,
            submodules=replace(
                layer,
                self_attention=attention,
                mlp=mlp,
                input_layernorm=norm(layer.input_layernorm, TorchNorm),
                pre_mlp_layernorm=norm(layer.pre_mlp_layernorm, TorchNorm),
            ),
        )

    return replace(
        block_spec,
        layer_specs=[swap(spec) for spec in block_spec.layer_specs],
        layer_norm=norm(block_spec.layer_norm, TorchNorm),
    )


def global_param_name(
    local_name: str, model_cfg: ModelConfig, trainer_cfg: TrainerConfig, pp_rank: int, ep_rank: int
) -> str:
    """A stage/shard-local megatron parameter name with global layer and expert numbers.

    A tied output layer on the last pipeline stage is the input embedding's twin: same name.
    """
    layers_per_stage = model_cfg.num_layers // trainer_cfg.pipeline_parallel
    name = re.sub(
        r"^decoder\.layers\.(\d+)\.",
        lambda m: f"decoder.layers.{int(m.group(1)) + pp_rank * layers_per_stage}.",
        local_name,
    )
    if model_cfg.is_moe:
        experts_per_rank = model_cfg.num_experts // trainer_cfg.expert_parallel
        name = re.sub(
            r"local_experts\.(\d+)\.", lambda m: f"local_experts.{int(m.group(1)) + ep_rank * experts_per_rank}.", name
        )
    if model_cfg.tie_word_embeddings and name == "output_layer.weight":
        name = "embedding.word_embeddings.weight"
    return name


def _init_std(name: str, model_cfg: ModelConfig) -> float | None:
    """megatron's init of a parameter: N(0, std), std / sqrt(2 L) for residual-branch outputs; None = ones/zeros.

    The vision encoder (``vision.*``) alike: its ViT blocks' outputs scaled by its own depth, its
    norms (``ln_pre``, ``post_layernorm``) ones, the projector plain N(0, std).
    """
    if name.endswith(".bias") or "layernorm" in name or name.startswith("vision.encoder.ln_"):
        return None
    if name.startswith("vision.projector."):
        return _INIT_STD
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        depth = model_cfg.vision.num_layers if name.startswith("vision.") else model_cfg.num_layers
        return _INIT_STD / (2.0 * depth) ** 0.5
    return _INIT_STD


@torch.no_grad()
def init_layout_independent(
    model: torch.nn.Module, model_cfg: ModelConfig, trainer_cfg: TrainerConfig, seed: int
) -> None:
    """Draw every parameter as this rank's shard of a full tensor seeded by its global name."""
    from megatron.core import parallel_state as ps

    pp_rank, ep_rank = ps.get_pipeline_model_parallel_rank(), ps.get_expert_model_parallel_rank()
    for local_name, param in model.named_parameters():
        name = global_param_name(local_name, model_cfg, trainer_cfg, pp_rank, ep_rank)
        std = _init_std(name, model_cfg)
        if std is None:
            param.fill_(0.0 if name.endswith(".bias") else 1.0)
            continue
        sharded = getattr(param, "tensor_model_parallel", False)
        is_expert = ".experts." in name
        rank = (
            (ps.get_expert_tensor_parallel_rank() if is_expert else ps.get_tensor_model_parallel_rank())
            if sharded
            else 0
        )
        world = (
            (ps.get_expert_tensor_parallel_world_size() if is_expert else ps.get_tensor_model_parallel_world_size())
            if sharded
            else 1
        )
        dim, stride = getattr(param, "partition_dim", 0), getattr(param, "partition_stride", 1)
        full_shape = list(param.shape)
        full_shape[dim] *= world
        generator = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
        full = torch.randn(full_shape, generator=generator, dtype=torch.float32) * std
        # megatron's split: chunks of (per-rank size / stride) dealt round-robin to the ranks
        chunks = torch.split(full, param.shape[dim] // stride, dim=dim)
        param.copy_(torch.cat(chunks[rank::world], dim=dim))
