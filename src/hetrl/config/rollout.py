"""``rollout:`` — generation engines: how many, where, and how they sample."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from hetrl.config.base import Section

# Why routing and recomputation under a pipeline do not mix: trainer/routing_replay.py keeps one
# micro-batch's routing, and a recomputed micro-batch's forward runs after 1F1B loaded later ones'.
ROUTING_WITH_RECOMPUTE = (
    "rollout.routing_replay / return_routing with trainer.recompute_activations=true needs "
    "trainer.pipeline_parallel=1: a pipeline recomputes a micro-batch after later ones' routing was loaded"
)


class RolloutConfig(Section):
    placement: Literal["colocated", "disaggregated"] = Field(
        "colocated",
        description="colocated: engines share the trainer's GPUs and sleep through each train step (vLLM sleep "
        "level 1: weights to host memory, KV cache dropped; on CPU they pause and keep their memory), so their "
        "unfinished samples wait through it under every schedule; disaggregated: engines on nodes of their own.",
    )
    engine_tensor_parallel: int = Field(1, ge=1, description="Tensor-parallel size inside one vLLM engine.")
    num_engines: int | None = Field(
        None, ge=1, description="Engines in the job; null fills the GPUs given to generation."
    )
    engine_nodes: int | None = Field(
        None, ge=1, description="disaggregated: nodes for engines (the rest train); null splits the nodes in half."
    )
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(-1, ge=-1, description="Top-k sampling (-1 disables).")
    max_tokens: int = Field(64, ge=1, description="Response token budget per turn.")
    stop: list[str] = Field(default_factory=list, description="Stop strings.")
    max_model_len: int | None = Field(
        None, ge=16, description="Engine context length; null = model.max_position_embeddings."
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Engine weights dtype; auto = trainer precision."
    )
    gpu_memory_utilization: float = Field(0.6, gt=0.0, le=1.0, description="Fraction of GPU memory vLLM may take.")
    kv_cache_memory_mb: int = Field(
        512, ge=16, description="CPU engines: KV-cache memory (vLLM otherwise reserves ~90% of RAM)."
    )
    enforce_eager: bool = Field(False, description="Disable CUDA graphs (always on for CPU engines).")
    weight_sync: Literal["auto", "collective", "ipc", "filesystem"] = Field(
        "auto",
        description="Trainer->engine weight transport: auto = ipc when every engine runs on trainer rank 0's GPU "
        "(colocated, one engine on its node), collective otherwise (a NCCL broadcast between GPUs; an engine "
        "colocated on rank 0's GPU receives on its second GPU, or, with one GPU, the push goes over gloo through "
        "host memory: NCCL refuses two ranks on one GPU).",
    )
    weight_sync_bucket_mb: int | None = Field(
        None,
        ge=1,
        description="Bucket size of the streamed weight sync, MiB; null = 256 on GPUs, 16 on CPUs (gloo: 256 MiB "
        "buffers are page-faulted in afresh on every push, 16 MiB ones are reused, ~1.7x faster).",
    )
    verify_weight_sync: bool = Field(False, description="Compare checksums of received weights with what was sent.")
    weight_sync_timeout_s: float = Field(
        300.0,
        gt=0.0,
        description="Time bound of a weight push: an engine waits this long for each bucket, and every engine must "
        "have taken the whole push this long after the orchestrator announced it. A push that times out stops the "
        "job naming the engines that did not take it (resume from the last checkpoint); an engine never serves a "
        "partial push. Colocated engines must also have slept this long after being told to, before a train step.",
    )
    weight_sync_retries: int = Field(
        2,
        ge=0,
        description="Times in a row a push an engine refused (checksum mismatch, missing tensors, TP workers that "
        "failed to load it) is sent again; the engine serves its old version meanwhile. One failure more stops "
        "the job.",
    )
    max_num_seqs: int = Field(256, ge=1, description="Sequences one engine decodes together (vLLM max_num_seqs).")
    max_num_batched_tokens: int | None = Field(
        None,
        ge=16,
        description="Tokens per engine step (vLLM max_num_batched_tokens); null = vLLM's default. Larger values avoid "
        "split prefills.",
    )
    cpu_threads_bind: str | None = Field(
        None,
        description="CPU engines: cores vLLM's OpenMP threads bind to, e.g. '0-1', or '0-3|4-7' per TP worker "
        "(VLLM_CPU_OMP_THREADS_BIND); null = every core this process may use, split evenly over the TP workers.",
    )
    partial_rollout: bool = Field(
        True,
        description="Interrupt in-flight requests for weight updates and resume them under the new weights (async "
        "schedules). Off: a request a push interrupts ends as 'abort', and one a colocated engine's sleep "
        "interrupted starts again from its prompt under the new weights.",
    )
    routing_replay: bool = Field(
        False,
        description="MoE rollout routing replay (R3): engines return the experts each token was routed to and the "
        "trainer's "
        "log-prob and training forwards reuse them, so trainer and engine compute the same sparse network. Turns the "
        "engines' "
        "prefix cache off (cached tokens are not routed again, so they would have no routing).",
    )
    return_routing: bool = Field(
        False,
        description="MoE: engines return each token's experts and the trainer reports how often its own router "
        "disagrees "
        "(routing/disagree_frac) without replaying them; routing_replay=true implies it.",
    )

    @model_validator(mode="after")
    def _check(self) -> RolloutConfig:
        if self.cpu_threads_bind and len(self.cpu_threads_bind.split("|")) != self.engine_tensor_parallel:
            raise ValueError(
                f"rollout.cpu_threads_bind={self.cpu_threads_bind!r} names {len(self.cpu_threads_bind.split('|'))} "
                f"core list(s) "
                f"for rollout.engine_tensor_parallel={self.engine_tensor_parallel} TP workers: give one list per "
                f"worker, "
                "separated by '|' (e.g. '0-3|4-7' for TP 2), or null"
            )
        return self

    @property
    def captures_routing(self) -> bool:
        """Whether engines return the experts each token was routed to."""
        return self.routing_replay or self.return_routing

    def weight_sync_bucket_bytes(self, on_gpu: bool) -> int:
        """The weight-sync bucket size in bytes (``weight_sync_bucket_mb``, or its default for the device)."""
        return (self.weight_sync_bucket_mb or (256 if on_gpu else 16)) << 20
