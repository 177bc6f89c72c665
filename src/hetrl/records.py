"""Records that cross role boundaries (rollout -> reward -> trainer), as plain dataclasses.

They carry token ids, never re-tokenised text as the source of truth: the trainer must see the very
tokens the engine sampled. Everything here is picklable and torch-free, so the MPI control plane
can ship it between processes and a login node can import it.

Alignment convention (used by every role): for a sample whose full sequence is
``prompt_ids + completion_ids``, the per-token lists ``loss_mask``, ``logprobs`` and ``versions``
have ``len(completion_ids)`` entries, one per completion token. In a multi-turn episode the
completion interleaves policy tokens (``loss_mask=1``, sampled by an engine) with environment
observation tokens (``loss_mask=0``, whose ``logprobs``/``versions`` entries are 0 / -1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class SamplingParams:
    """What an engine needs to sample one request (mirrors ``rollout`` keys of the recipe)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 64
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False  # keep sampling past EOS (benchmarks and length tests)


@dataclass
class EpisodeItem:
    """One episode to run: ``group_size`` items share a ``group_id`` (the same task)."""

    sample_id: str
    group_id: str
    task: Any  # hetrl.env.base.Task
    seed: int


@dataclass
class GenerationRequest:
    """One prompt sent to an engine; ``request_id`` is unique per run."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    # Images (PIL or encoded bytes) for multimodal prompts, passed through to engines that take them.
    images: list[Any] = field(default_factory=list)


@dataclass
class GenerationResult:
    """One sampled completion of one request (a request with n=4 yields 4 results)."""

    request_id: str
    sample_index: int
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]  # log-prob of each sampled token under the engine's policy
    versions: list[int]  # weight version that generated each token (partial rollouts mix them)
    finish_reason: str  # "stop" | "length" | "abort" | "rejected"
    error: str | None = None  # why a request was rejected (e.g. prompt longer than the context)
    # Routing replay (MoE): the experts each token fed to the model was routed to, uint8/uint16
    # [prompt + response - 1, moe layers, top_k] (the last sampled token was never fed); else None.
    routed_experts: np.ndarray | None = None


REWARD_METRICS_KEY = "reward_metrics"  # Sample.info key of the reward functions' per-sample metrics (name -> value)
ENV_REWARD_KEY = "env"  # Sample.rewards key of the environment's own verdict (summed by the episode runner)
ENV_WAIT_KEY = (
    "env_wait_s"  # Sample.info key of the seconds the episode waited for an environment slot (env.concurrency)
)
CONVERSATION_KEY = "messages"  # Sample.info key of the episode as chat messages, text only ({"role", "content"} each)


@dataclass
class Sample:
    """A finished episode, ready for reward and then training.

    ``sample_id`` is unique per run and stable across retries, so the loop can prove that no
    sample is lost or trained on twice; ``group_id`` ties the n samples of one prompt together
    (GRPO-style group advantages).
    """

    sample_id: str
    group_id: str
    task_name: str
    prompt_ids: list[int]
    completion_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str = "stop"
    prompt_text: str = ""
    completion_text: str = ""
    answer: Any = None  # reference answer / tests, as the task defines it; never shown to the policy
    rewards: dict[str, float] = field(default_factory=dict)  # per reward source
    reward: float = 0.0  # the weighted total the advantage uses
    flags: list[str] = field(default_factory=list)  # reward-hacking and sanity flags
    num_turns: int = 1
    num_tool_calls: int = 0
    info: dict[str, Any] = field(default_factory=dict)  # env info; CONVERSATION_KEY, REWARD_METRICS_KEY (above)
    # Images of a multimodal episode in the order their placeholders appear in the tokens (the
    # trainer needs them to recompute log-probs); empty for text-only episodes.
    images: list[Any] = field(default_factory=list)
    # Routing replay (MoE): the engine's experts for every token of prompt + completion but the
    # last, uint8/uint16 [len(prompt_ids) + len(completion_ids) - 1, moe layers, top_k]; else None.
    # A multi-turn episode carries its last turn's routing, which covers the whole sequence.
    routed_experts: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.completion_ids)
        lengths = {"loss_mask": len(self.loss_mask), "logprobs": len(self.logprobs), "versions": len(self.versions)}
        bad = {k: v for k, v in lengths.items() if v != n}
        if bad:
            raise ValueError(
                f"sample {self.sample_id}: per-token lists must have {n} entries (completion length), got {bad}"
            )
        rows = len(self.prompt_ids) + n - 1
        if self.routed_experts is not None and (self.routed_experts.ndim != 3 or self.routed_experts.shape[0] != rows):
            raise ValueError(
                f"sample {self.sample_id}: routed_experts must be [{rows}, layers, top_k] (prompt + completion - 1 "
                f"tokens), got {tuple(self.routed_experts.shape)}"
            )

    @property
    def min_version(self) -> int:
        """Oldest weight version among the policy tokens (-1 when there are none)."""
        policy_versions = [v for v, m in zip(self.versions, self.loss_mask) if m]
        return min(policy_versions) if policy_versions else -1


@dataclass
class SampleMeta:
    """A sample without its payloads (token ids, log-probs, routing, images, texts): what the orchestrator
    keeps of it, and what every trainer rank needs of every sample of a step.

    The engine that generated a sample keeps the payloads and sends them where they are used (its scoring
    view to a reward rank, the sample to the trainer replica that trains on it); the orchestrator routes,
    schedules and keeps the ledger on these few scalars alone, so its traffic does not grow with the
    responses' lengths. The reward fields start as the episode's and take the reward rank's verdict
    (``ScoredSample.apply_to``). ``info`` is the episode's info without the conversation (the texts stay
    with the payloads). ``prompt_key`` identifies the prompt's tokens: two samples of a group share a model
    row with shared prompts only when their prompts are the same (a hash of int tuples is the same in every
    process).
    """

    sample_id: str
    group_id: str
    prompt_len: int
    completion_len: int
    num_images: int
    prompt_key: int
    task_name: str = ""
    num_policy_tokens: int = 0
    min_version: int = -1  # the oldest weight version among the policy tokens (-1 when there are none)
    finish_reason: str = "stop"
    num_turns: int = 1
    num_tool_calls: int = 0
    rewards: dict[str, float] = field(default_factory=dict)
    reward: float = 0.0
    flags: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, sample: Sample) -> SampleMeta:
        return cls(
            sample_id=sample.sample_id,
            group_id=sample.group_id,
            task_name=sample.task_name,
            prompt_len=len(sample.prompt_ids),
            completion_len=len(sample.completion_ids),
            num_policy_tokens=sum(sample.loss_mask),
            num_images=len(sample.images),
            prompt_key=hash(tuple(sample.prompt_ids)),
            min_version=sample.min_version,
            finish_reason=sample.finish_reason,
            num_turns=sample.num_turns,
            num_tool_calls=sample.num_tool_calls,
            rewards=dict(sample.rewards),
            reward=sample.reward,
            flags=list(sample.flags),
            info={k: v for k, v in sample.info.items() if k != CONVERSATION_KEY},
        )

    def model_length(self, tokens_per_image: int | None) -> int:
        """Model positions (prompt + completion, image placeholders expanded); ``None``: a text model."""
        n = self.prompt_len + self.completion_len
        return n if tokens_per_image is None else n + self.num_images * (tokens_per_image - 1)

    def scored(self, sample: Sample) -> Sample:
        """``sample`` (this meta's payloads) with the verdict this meta carries: rewards, total, flags, info."""
        sample.rewards, sample.reward, sample.flags = dict(self.rewards), self.reward, list(self.flags)
        sample.info.update(self.info)
        return sample


def id_order(sample_id: str) -> tuple[str, int, int]:
    """Sort key of a sample id ``<purpose letter><group number>.<index>``: creation order.

    Samples arrive in completion order, which varies from run to run; whatever sums over them
    (advantages, losses, metrics) must see them in this order for a run to be reproducible.
    """
    group, _, index = sample_id.partition(".")
    return group[0], int(group[1:]), int(index or 0)
