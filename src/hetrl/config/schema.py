"""The whole recipe as one typed tree: every key a recipe or a ``key=value`` override may set.

Importable without torch, so a login node validates a recipe before anything is submitted.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from hetrl.config.algorithm import AlgorithmConfig
from hetrl.config.base import Section
from hetrl.config.cluster import ClusterConfig
from hetrl.config.critic import CriticConfig
from hetrl.config.env import EnvConfig
from hetrl.config.loop import CheckpointConfig, EvalConfig, RunConfig, ScheduleConfig, WarmStartConfig
from hetrl.config.model import ModelConfig
from hetrl.config.monitor import MonitorConfig
from hetrl.config.reward import RewardConfig
from hetrl.config.rollout import ROUTING_WITH_RECOMPUTE, RolloutConfig
from hetrl.config.trainer import TrainerConfig
from hetrl.models.tokenizer import MIN_VOCAB_SIZE


class HetrlConfig(Section):
    recipe: str = Field("custom", description="Name of the recipe this config was composed from (informational).")
    nodes: int = Field(
        1, ge=1, description="GPU-partition nodes for trainer + engines (CPU-only: the number of local 'nodes', 1)."
    )
    run: RunConfig = Field(default_factory=RunConfig, description="Run identity, seed and length.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy architecture and weights.")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="RL objective.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Trainer parallelism and optimisation.")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="PPO's value model (algorithm.name=ppo).")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Generation engines.")
    env: EnvConfig = Field(default_factory=EnvConfig, description="Environment and tasks.")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Rewards and sandbox.")
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig, description="Sync/async schedule.")
    warm_start: WarmStartConfig = Field(
        default_factory=WarmStartConfig, description="Supervised warm start on demonstrations."
    )
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpointing and resume.")
    monitor: MonitorConfig = Field(
        default_factory=MonitorConfig, description="Metrics, console, rollout store, guards."
    )
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="Cluster profile.")

    @property
    def engine_dtype(self) -> str:
        """The engines' weight dtype: ``rollout.dtype``, or with ``auto`` the trainer's precision, so that
        the engine samples with the arithmetic the trainer scores."""
        if self.rollout.dtype != "auto":
            return self.rollout.dtype
        return "bfloat16" if self.trainer.precision == "bf16" else "float32"

    @model_validator(mode="after")
    def _check_cross_section(self) -> HetrlConfig:
        """Combinations that validate section by section but fail on the compute nodes: refused here,
        on the login node (each check names the runtime code that would fail)."""
        if self.trainer.expert_parallel > 1 and not self.model.is_moe:
            raise ValueError(
                f"trainer.expert_parallel={self.trainer.expert_parallel} needs an MoE model (model.arch=qwen3_moe)"
            )
        if self.cluster.gpus_per_node == 0:
            _check_cpu_profile(self)
        _check_model_layout(self)
        _check_engines(self)
        _check_algorithm_and_stages(self)
        _check_batch_and_lengths(self)
        _check_adaptive_staleness(self)
        _check_reward_server(self)
        _check_vision(self)
        _check_shared_prompts(self)
        return self


def _check_cpu_profile(cfg: HetrlConfig) -> None:
    """What the trainer and the transports refuse without a GPU (trainer/parallel.py check_layout, ...).

    Sequence parallelism (and so MoE under TP, which needs it: ``_check_model_layout``) runs on CPU: the local
    spec's norms are hetrl's (trainer/norms.py ``TorchNorm``), which allow it."""
    t, cpu = cfg.trainer, "on a CPU-only cluster profile (cluster.gpus_per_node=0)"
    if t.transformer_impl == "transformer_engine":
        raise ValueError(
            f"trainer.transformer_impl=transformer_engine {cpu}: transformer-engine needs a GPU; use auto or local"
        )
    if cfg.rollout.weight_sync == "ipc":
        raise ValueError(f"rollout.weight_sync=ipc {cpu}: CUDA IPC needs GPUs; use auto, collective or filesystem")


def _check_model_layout(cfg: HetrlConfig) -> None:
    """Shapes the trainer's parallel layout must divide, beyond the planner's (control/plan.py)."""
    m, tp = cfg.model, cfg.trainer.tensor_parallel
    if m.is_moe and tp > 1 and not cfg.trainer.sequence_parallel:
        # megatron's MoELayer refuses to train under TP without sequence parallelism.
        raise ValueError(
            f"trainer.tensor_parallel={tp} with an MoE model needs trainer.sequence_parallel=true: megatron trains MoE "
            "layers under tensor parallelism only with sequence parallelism"
        )
    if m.is_moe and m.moe_ffn_hidden_size % tp:
        gpn = cfg.cluster.gpus_per_node
        valid = [
            d for d in range(1, m.moe_ffn_hidden_size + 1) if m.moe_ffn_hidden_size % d == 0 and (not gpn or d <= gpn)
        ][:8]
        raise ValueError(
            f"trainer.tensor_parallel={tp} does not divide model.moe_ffn_hidden_size={m.moe_ffn_hidden_size} "
            f"(megatron splits each expert's MLP over TP); valid tensor_parallel values: {valid}"
        )
    if m.hf_checkpoint is None and m.vocab_size < MIN_VOCAB_SIZE + m.is_vlm:
        raise ValueError(
            f"model.vocab_size={m.vocab_size} is smaller than the built-in character tokenizer a random-init model "
            f"(model.hf_checkpoint=null) is written with: set model.vocab_size >= {MIN_VOCAB_SIZE + m.is_vlm}"
            + (" (its <image> token included)" if m.is_vlm else "")
        )


def _check_engines(cfg: HetrlConfig) -> None:
    """What vLLM and the weight transports refuse at start-up (rollout/engine.py, transport/weights/factory.py)."""
    r, m = cfg.rollout, cfg.model
    if r.captures_routing and not m.is_moe:
        key = "routing_replay" if r.routing_replay else "return_routing"
        raise ValueError(
            f"rollout.{key}=true needs an MoE model (model.arch=qwen3_moe): model.arch={m.arch} routes no token"
        )
    if r.captures_routing and cfg.trainer.recompute_activations and cfg.trainer.pipeline_parallel > 1:
        raise ValueError(ROUTING_WITH_RECOMPUTE)
    if r.max_model_len is not None and r.max_model_len > m.max_position_embeddings:
        raise ValueError(
            f"rollout.max_model_len={r.max_model_len} exceeds "
            f"model.max_position_embeddings={m.max_position_embeddings}: "
            "vLLM refuses a context longer than the checkpoint's; lower rollout.max_model_len or leave it null"
        )
    if r.weight_sync == "ipc" and cfg.cluster.gpus_per_node:
        engines = r.num_engines or cfg.cluster.gpus_per_node // r.engine_tensor_parallel
        if r.placement != "colocated" or cfg.nodes != 1 or engines != 1:
            # transport/weights/factory.py resolve_transport: IPC handles open only on trainer rank 0's GPU.
            raise ValueError(
                "rollout.weight_sync=ipc needs the job's only engine colocated on trainer rank 0's GPU "
                "(rollout.placement="
                f"colocated, nodes=1, one engine), got placement={r.placement}, nodes={cfg.nodes}, {engines} "
                f"engine(s); "
                "use rollout.weight_sync=auto (it picks ipc when it can) or collective"
            )


def _check_algorithm_and_stages(cfg: HetrlConfig) -> None:
    """The critic (read by ppo only) and the warm-start stage's LR schedule (trainer/optim.py: megatron asserts lr >=
    min_lr)."""
    if cfg.algorithm.name != "ppo":
        changed = [f"critic.{key}" for key, value in cfg.critic if value != CriticConfig.model_fields[key].default]
        if changed:
            raise ValueError(
                f"{', '.join(changed)} set, but algorithm.name={cfg.algorithm.name!r} has no value model (only ppo "
                "reads critic:): remove them, or use algorithm.name=ppo"
            )
    if cfg.warm_start.steps and cfg.trainer.min_lr > cfg.warm_start.lr:
        raise ValueError(
            f"trainer.min_lr={cfg.trainer.min_lr:g} exceeds warm_start.lr={cfg.warm_start.lr:g}, and the warm start's "
            "schedule decays to trainer.min_lr: lower trainer.min_lr or raise warm_start.lr"
        )


def _check_batch_and_lengths(cfg: HetrlConfig) -> None:
    """A step's batch against how the trainer splits it (trainer/rl_step.py, trainer/batch.py)."""
    samples = cfg.run.prompts_per_step * cfg.algorithm.group_size
    if cfg.trainer.updates_per_batch > samples:
        raise ValueError(
            f"trainer.updates_per_batch={cfg.trainer.updates_per_batch} splits each step's run.prompts_per_step x "
            f"algorithm.group_size = {cfg.run.prompts_per_step} x {cfg.algorithm.group_size} = {samples} samples into "
            f"that many minibatches: use trainer.updates_per_batch <= {samples}"
        )
    pack, longest = cfg.trainer.pack_length, cfg.env.max_episode_tokens
    if cfg.model.vision is not None and cfg.env.name in IMAGE_ENVIRONMENTS:
        # env.max_episode_tokens counts an image as its one placeholder; the trainer packs it as tokens_per_image
        # positions, and an episode shows at most one image a turn.
        longest += cfg.env.max_turns * (cfg.model.vision.tokens_per_image - 1)
    if pack is not None and pack < longest:
        raise ValueError(
            f"trainer.pack_length={pack} is shorter than the longest episode the trainer may get ({longest} positions: "
            f"env.max_episode_tokens, and for a vision-language policy each turn's image expanded): an episode "
            f"that long fits no bin; use trainer.pack_length >= {longest}"
        )


def _check_adaptive_staleness(cfg: HetrlConfig) -> None:
    """The metric an adaptive staleness bound follows must be one the trainer measures (trainer/algorithms.py
    _is_weights: the is/* fractions come only with an IS correction, each 0 under the others)."""
    adaptive = cfg.schedule.adaptive_staleness
    needs = {"is/truncated_frac": ("truncated",), "is/masked_frac": ("masked", "icepop")}.get(adaptive.metric)
    if adaptive.enabled and needs is not None and cfg.algorithm.is_correction not in needs:
        raise ValueError(
            f"schedule.adaptive_staleness.metric={adaptive.metric} is measured only with "
            f"algorithm.is_correction={' or '.join(needs)}, but algorithm.is_correction="
            f"{cfg.algorithm.is_correction!r}: the bound would never see it rise; set "
            f"algorithm.is_correction={needs[0]} or adaptive_staleness.metric=mismatch/k3_kl"
        )


def _check_reward_server(cfg: HetrlConfig) -> None:
    """A reward worker waiting on a stuck server makes no progress: it must re-send the request to another
    replica (hetrl.loop.reward_server_role) before the liveness watchdog ends the job."""
    server, hang = cfg.reward.server, cfg.monitor.hang_timeout_s
    if cfg.reward.served_models and server.request_timeout_s >= hang:
        raise ValueError(
            f"reward.server.request_timeout_s={server.request_timeout_s:g} must be shorter than monitor.hang_timeout_s="
            f"{hang:g}: a request stuck on one replica is re-sent to another only after it, and the watchdog would end "
            "the job first; lower reward.server.request_timeout_s"
        )


IMAGE_ENVIRONMENTS = ("multimodal", "screen")  # environments whose observations are images


def _check_vision(cfg: HetrlConfig) -> None:
    """Images need a vision-language policy (env/runner.py refuses to send them to a text engine)."""
    if cfg.env.name in IMAGE_ENVIRONMENTS and not cfg.model.is_vlm:
        raise ValueError(
            f"env.name={cfg.env.name} shows the policy images, but model.arch={cfg.model.arch} is a text model: "
            "use a vision-language policy (model=tiny_llava, or model.arch=llava with model.vision)"
        )
    vision, t = cfg.model.vision, cfg.trainer
    if vision is not None:
        # trainer/vision.py: the image features replace a sample's placeholder positions before the language model,
        # which a rank holding a sequence chunk (context or sequence parallel) cannot do for positions it lacks.
        if t.context_parallel > 1 or t.sequence_parallel:
            raise ValueError(
                f"a vision-language policy (model.arch=llava) trains without context or sequence parallelism: got "
                f"trainer.context_parallel={t.context_parallel}, trainer.sequence_parallel={t.sequence_parallel}"
            )
        for key, size in (
            ("num_attention_heads", vision.num_attention_heads),
            ("ffn_hidden_size", vision.ffn_hidden_size),
        ):
            if size % t.tensor_parallel:
                raise ValueError(
                    f"trainer.tensor_parallel={t.tensor_parallel} does not divide model.vision.{key}={size} "
                    "(megatron splits the vision tower over TP like the language model)"
                )
    if cfg.eval.image_ablation and cfg.env.name != "multimodal":
        raise ValueError(
            f"eval.image_ablation=true moves each task's scene to another task, which only env.name=multimodal "
            f"draws from its task (got env.name={cfg.env.name})"
        )


def _check_shared_prompts(cfg: HetrlConfig) -> None:
    """trainer.shared_prompts lays a prompt's completions out as branches of one row (hetrl.trainer.shared_prompts):
    every rank must hold whole rows, the attention is hetrl's own (a tree mask), and a branch is text only."""
    t = cfg.trainer
    if not t.shared_prompts:
        return
    refused = {
        "trainer.context_parallel > 1": t.context_parallel > 1,
        "trainer.sequence_parallel": t.sequence_parallel,
        "trainer.pack_length": t.pack_length is not None,
        "trainer.transformer_impl=transformer_engine": t.transformer_impl == "transformer_engine",
        "a vision-language policy": cfg.model.is_vlm,
        "MoE routing replay (rollout.routing_replay / return_routing)": cfg.rollout.captures_routing,
    }
    found = [name for name, on in refused.items() if on]
    if found:
        raise ValueError(
            f"trainer.shared_prompts=true does not run with {', '.join(found)}: set trainer.shared_prompts=false"
        )
