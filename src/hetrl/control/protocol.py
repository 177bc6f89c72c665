"""Every wire message of the RL loop, in one place: what each role sends which other role.

Messages are plain dataclasses, pickled by mpi4py (``hetrl.control.comm``). The orchestrator owns
every sample id; a worker only ever answers with the ids it was given, so the orchestrator can
prove that each sample was generated, rewarded and trained at most once.

Payloads travel where they are used, never through the orchestrator, which deals in
:class:`~hetrl.records.SampleMeta` alone. The engine that generated a sample keeps it: it sends the
sample's :class:`ScoringView` straight to the reward rank the orchestrator named (:class:`RolloutWork`),
and, when the orchestrator puts the sample in a step, the sample to the trainer replica that trains on it
(:class:`ShipSamples` -> :class:`TrainShard`); a sample that will not be trained is dropped
(:class:`DropSamples`). The trainer's leader tells the orchestrator once where each replica receives
(:class:`TrainerLayout`).

Sections: the orchestrator's work and its results (rollout, reward, trainer), weight pushes,
checkpoints, the services (env, reward server), pre-emption, and the start-up handshake.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hetrl.control.plan import RankAssignment
from hetrl.records import CONVERSATION_KEY, REWARD_METRICS_KEY, EpisodeItem, Sample, SampleMeta, SamplingParams


@dataclass
class RolloutWork:
    items: list[EpisodeItem]
    sampling: SamplingParams
    purpose: str  # "train" | "eval"
    reward_rank: int  # the world rank the engine sends the finished samples' scoring views to


@dataclass
class RolloutDone:
    """Engine -> orchestrator: samples finished (their metadata; the engine keeps the payloads and has sent
    their scoring views to the work's reward rank) and episodes lost (re-queued)."""

    metas: list[SampleMeta]
    failed: list[str] = field(default_factory=list)  # sample ids the engine could not finish (re-queued)


@dataclass
class RescoreSamples:
    """Orchestrator -> engine: send these held samples' scoring views to ``reward_rank`` (their scoring failed)."""

    sample_ids: list[str]
    reward_rank: int


@dataclass
class ShipSamples:
    """Orchestrator -> engine: send held samples to the trainer replicas of step ``step``, one
    :class:`TrainShard` per ``(receiver world rank, the samples' metadata)``, each sample given the verdict its
    metadata carries (``SampleMeta.scored``: the rollout store keeps it beside the tokens), and forget them."""

    step: int
    shards: list[tuple[int, list[SampleMeta]]]


@dataclass
class DropSamples:
    """Orchestrator -> engine: forget these held samples (evaluated, dropped as stale or uninformative, or about
    to be generated again)."""

    sample_ids: list[str]


@dataclass
class TrainShard:
    """A holder (an engine; the orchestrator for warm-start demonstrations) -> a trainer replica's receiver
    (``Tag.SHARD``): samples of step ``step`` that replica trains on."""

    step: int
    samples: list[Sample]


@dataclass
class TrainerLayout:
    """Trainer leader -> orchestrator, once at start: where each data-parallel replica receives its shard, and what
    the shard functions (``hetrl.trainer.shards``) need besides the metadata to deal a step as the trainer does."""

    receivers: list[int]  # world rank of each replica's receiver, by data-parallel rank
    tokens_per_image: int | None  # image placeholder expansion; None: a text model
    shared_prompts: bool


@dataclass
class ScoringView:
    """What a rubric reads of one sample (``hetrl.reward``), and all a reward rank is sent of it.

    The texts, the reference answer, how the episode ended and how many tokens it took, the environment's own
    rewards and the episode as chat messages (for a judge or a reward model). Routing arrays, images, log-probs and
    weight versions never travel to a reward rank; the completion's token ids only for a rubric that reads them
    (``RewardConfig.reads_completion_ids``). The attributes are named as ``Sample``'s, so a rubric scores a whole
    sample the same way (held-out evaluation, benches).
    """

    sample_id: str
    prompt_text: str
    completion_text: str
    answer: Any
    finish_reason: str
    num_completion_tokens: int
    rewards: dict[str, float]  # the environment's own verdict (ENV_REWARD_KEY), summed by the episode runner
    info: dict[str, Any]  # CONVERSATION_KEY alone, when the episode runner recorded it
    completion_ids: list[int] | None = None  # None unless the rubric reads token ids

    @classmethod
    def of(cls, sample: Sample, with_completion_ids: bool) -> ScoringView:
        messages = sample.info.get(CONVERSATION_KEY)
        return cls(
            sample.sample_id,
            sample.prompt_text,
            sample.completion_text,
            sample.answer,
            sample.finish_reason,
            len(sample.completion_ids),
            dict(sample.rewards),
            {CONVERSATION_KEY: messages} if messages else {},
            list(sample.completion_ids) if with_completion_ids else None,
        )


@dataclass
class ScoredSample:
    """A reward rank's verdict on one sample: what the orchestrator merges into the sample it kept."""

    sample_id: str
    rewards: dict[str, float]  # raw score per reward source
    reward: float  # the weighted total the advantage uses
    flags: list[str]
    metrics: dict[str, float]  # the reward functions' per-sample metrics (Sample.info[REWARD_METRICS_KEY])

    def apply_to(self, sample: SampleMeta) -> SampleMeta:
        """Write the verdict into the sample's metadata (its own flags, from the episode, are kept)."""
        sample.rewards = dict(self.rewards)
        sample.reward = self.reward
        sample.flags = sorted(set(sample.flags) | set(self.flags))
        sample.info[REWARD_METRICS_KEY] = dict(self.metrics)
        return sample


@dataclass
class RewardWork:
    """Engine -> reward rank: what the rubric reads of samples; the verdicts go to the orchestrator."""

    views: list[ScoringView]


@dataclass
class RewardDone:
    scored: list[ScoredSample]  # verdicts on samples of earlier RewardWork, each id once
    failed: list[str] = field(default_factory=list)  # sample ids to score again (elsewhere if possible)
    score_s: float = 0.0  # the worker's wall time scoring this batch (the orchestrator's time/reward)


@dataclass
class TrainWork:
    """One step's metadata, every sample in order, sent once to the trainer's leader (trainer rank 0), which
    shares it with every trainer rank; each replica's samples come as :class:`TrainShard`. The trainer turns
    the rewards into advantages.

    Only what the trainer reads of a sample's metadata (:data:`TRAIN_FIELDS`), in columns: every trainer rank
    receives it, so its bytes per sample weigh against each rank's shard (~40 bytes a sample here, against ~270
    for whole ``SampleMeta`` objects with their rewards and info). Read it back with :attr:`metas`.
    """

    step: int
    columns: dict[str, list[Any]]  # a TRAIN_FIELDS name -> its value for every sample of the step, in order
    supervised: bool = False  # warm-start: maximise the likelihood of demonstrations

    @classmethod
    def of(cls, step: int, metas: list[SampleMeta], supervised: bool = False) -> TrainWork:
        return cls(step, {name: [getattr(m, name) for m in metas] for name in TRAIN_FIELDS}, supervised)

    @property
    def metas(self) -> list[SampleMeta]:
        """The step's samples as ``SampleMeta`` (the fields the trainer does not read keep their defaults)."""
        return [SampleMeta(**dict(zip(self.columns, values))) for values in zip(*self.columns.values())]


# What the trainer reads of a sample's metadata: the shard functions' (hetrl.trainer.shards) and the advantages'.
TRAIN_FIELDS = ("sample_id", "group_id", "reward", "prompt_len", "completion_len", "num_images", "prompt_key")


@dataclass
class TrainDone:
    """The step's metrics (the engine vs trainer mismatch included: the trainer holds both log-probs)."""

    step: int
    version: int
    metrics: dict[str, float]


@dataclass
class SyncWeights:
    """Engines: receive weights of ``version`` now (the trainer is sending them).

    ``attempt`` counts the sends of one version: 0 for the push after a step, 1 and up for the
    pushes again after an engine refused one (:class:`PushRefused`).
    """

    version: int
    attempt: int = 0


@dataclass
class ReleaseMemory:
    """Colocated engines: the trainer is about to step on your GPUs; sleep, then say :class:`MemoryReleased`.
    The next :class:`SyncWeights` wakes the weights for its push, and the KV cache after it."""


@dataclass
class MemoryReleased:
    """Engine -> orchestrator: asleep; the trainer's step may use the memory the engine held."""


@dataclass
class PushWeights:
    """Trainer ranks: push the weights of ``version`` (the ones they hold) once more, as its
    ``attempt``-th send (see :class:`SyncWeights`)."""

    version: int
    attempt: int


@dataclass
class ServingWeights:
    """Engine -> orchestrator: the engine now serves ``version`` (held-out evaluation waits for it)."""

    version: int


@dataclass
class PushFailed:
    """Trainer rank 0 -> orchestrator: push ``version`` (its ``attempt``-th send) broke off (a timeout
    or a lost engine); the orchestrator names the engines that did not take it and stops the job."""

    version: int
    attempt: int
    reason: str


@dataclass
class PushRefused:
    """Engine -> orchestrator: push ``version`` (its ``attempt``-th send) was refused, the engine
    serves its old weights; the push was read to its end, so it can come again."""

    version: int
    attempt: int
    reason: str


@dataclass
class Checkpoint:
    """Trainer ranks: save a checkpoint with the loop's state (data cursor, counters)."""

    step: int
    loop_state: dict[str, Any]


@dataclass
class Shutdown:
    reason: str = "done"


@dataclass
class CheckpointDone:
    """Trainer rank 0 -> orchestrator: the checkpoint of ``Checkpoint.step`` is complete at ``path``."""

    path: str


@dataclass
class Restore:
    """Trainer ranks: load the checkpoint at ``path`` and push its weights to the engines."""

    path: str


@dataclass
class Restored:
    """Trainer rank 0 -> orchestrator: weights of ``version`` loaded (and being pushed); the saved loop state."""

    version: int
    loop_state: dict[str, Any]


# ---------------------------------------------------------------- services (rollout <-> env, reward <-> reward_server)
# hetrl.control.service: a client sends Requests and ClientDone on Tag.WORK; a server answers Ready, Replies and Down
# on Tag.RESULT.


@dataclass
class Requests:
    """``(request_id, method, payload)`` of one client round to one server; ids are the client's own."""

    calls: list[tuple[int, str, Any]]


@dataclass
class Replies:
    """Answers ``(request_id, ok, value)`` (the error's text when not ok); ``load`` is the server's load as it sent
    them (open episodes, requests held): clients route new work to the least loaded."""

    replies: list[tuple[int, bool, Any]]
    load: int


@dataclass
class Ready:
    """The server can serve (its models are loaded): requests sent now are answered within a request's deadline."""


@dataclass
class Down:
    """The server stopped serving for good; every request it held is unanswered."""

    reason: str


@dataclass
class ClientDone:
    """The client is leaving: it sends no more requests and needs no more answers."""


# ---------------------------------------------------------------- pre-emption (any rank -> orchestrator)


@dataclass
class PreemptNotice:
    """A rank other than the orchestrator received a pre-emption signal."""

    signum: int


@dataclass
class Bye:
    """A rank's role returned; it is about to exit."""


# ---------------------------------------------------------------- start-up handshake (hetrl.control.handshake)


@dataclass
class Hello:
    """A rank -> orchestrator (``Tag.HELLO``): its place in the plan, and the digest of the plan it loaded."""

    assignment: RankAssignment
    digest: str
    pid: int
    host: str
    role_size: int


@dataclass
class Start:
    """Orchestrator -> every rank (``Tag.START``): every rank loaded the same plan; send the heartbeats."""


@dataclass
class Heartbeat:
    """A rank -> orchestrator (``Tag.HEARTBEAT``): its ``beat``-th heartbeat, sent at ``time`` (epoch seconds)."""

    rank: int
    beat: int
    time: float


@dataclass
class HandshakeDone:
    """Orchestrator -> every rank (``Tag.SHUTDOWN``): every heartbeat came; the handshake is over."""
