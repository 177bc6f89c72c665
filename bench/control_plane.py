"""Control plane: every byte a simulated ``moe_grpo`` step moves, and how many samples the orchestrator can route.

The real ``hetrl.loop.orchestrator.Orchestrator`` runs the recipe's async schedule (``top_up``,
``collect_batch``, ``train``, as ``hetrl.loop.driver.rl_step`` calls them) in this process, on the
real plan of 128 and 1,024 nodes (``hetrl.control.plan.make_plan``: its engines, reward ranks and
trainer ranks), with R3 on (``rollout.routing_replay``). Its MPI world is a fake that implements
what ``hetrl.control.comm`` calls (``isend``, ``Iprobe``, ``improbe`` ... ``irecv().test()``) and
pickles every message as mpi4py does (``MPI.pickle.PROTOCOL``, the envelope included): the bytes
counted are the wire's, per (sender, receiver, message type). Behind it, fake roles answer with the
real messages of ``hetrl.control.protocol`` along the data plane's paths, as the real roles do
(``hetrl.loop.rollout_role``, ``reward_role``; the messages between roles are pickled and counted the
same way):

* an engine answers each ``RolloutWork`` sample by sample (long-tailed lengths finish apart): it keeps
  the ``Sample``, sends the orchestrator its ``RolloutDone`` (the ``SampleMeta``) and the work's reward
  rank its ``RewardWork`` (the ``ScoringView``); on ``ShipSamples`` it sends each named trainer receiver
  a ``TrainShard`` of the samples and forgets them (``DropSamples``: forgets them). It answers
  ``SyncWeights`` with ``ServingWeights`` and ``ReleaseMemory`` (the recipe's engines are colocated)
  with ``MemoryReleased``. Its samples are shaped as ``hetrl.env.runner`` builds them: the task's
  prompt (real gsm_symbolic tasks from the recipe's stream), token ids, per-token lists, decoded texts,
  the conversation for the rubric, and ``routed_experts`` uint8 [prompt + completion - 1, 48 MoE
  layers, top-8];
* a reward rank answers each ``RewardWork`` with a ``RewardDone`` of its verdicts (``ScoredSample``:
  rewards, flags, the rubric's metrics) to the orchestrator;
* the trainer's leader sends the orchestrator one ``TrainerLayout`` before the first step. Its
  receivers: replica d's is trainer rank d x TP x CP, the lowest rank of its data-parallel replica
  under megatron's ``tp-cp-ep-dp-pp`` order (pipeline stage 0, TP and CP rank 0). Each
  ``TrainWork`` (the step's metadata) it shares with every trainer rank through the real
  ``comm.share`` over a fake communicator (what each rank receives is counted), checks that every
  replica's receiver got exactly the samples ``hetrl.trainer.shards.step_shards`` deals it, and answers
  ``TrainDone`` (metrics). Each receiver then shares its shard with the other TP x PP x CP - 1 ranks of
  its replica (``comm.share`` again, counted per replica). A broadcast's forwarding (a tree, or MPICH's
  scatter-allgather for large messages) is not counted as anyone's sends: each rank is counted
  receiving the payload once, the root sending it once.

Lengths: prompts are the tasks' own (~4 characters a token, plus 20 tokens of chat template);
responses are log-normal, median 4,000 tokens, sigma 0.6, capped at ``rollout.max_tokens`` = 8,192
(mean ~4,400, ~11% hit the cap): a reasoning model's RL at an 8k cap (DAPO's and Qwen3's reports:
means of 3-5k that grow through training, a tail clipped at the cap). Each step's responses are the
distribution's evenly spaced quantiles, so every step holds the same lengths and a message's bytes
do not depend on which step's samples it carries. Bytes are linear in the lengths, so the ratios
hardly depend on this choice. The VLM variant adds one image per sample, the
PNG of a scene of the multimodal env (``hetrl.env.envs.multimodal``, as tiny_vlm_grpo and its
rollouts carry it: ``Sample.images`` holds encoded bytes, ``hetrl.models.images.to_png``).

Subset: a full step at 1,024 nodes (2,048 samples of ~1.6 MiB of routing each, several copies in flight)
does not fit in this machine's memory, so each step simulates ``--groups`` of the recipe's 256
prompt groups with the real objects, on DP x groups / 256 trainer replicas (the TrainerLayout the
leader announces), so that each replica trains on as many samples as at full scale (2 at 1,024 nodes,
16 at 128), and scales by exact multiplicity: every message that carries samples or their metadata
is counted per sample, measured, and multiplied by 256 / groups; the messages to and from every
engine (``SyncWeights``, ``ReleaseMemory`` and their answers) are sent to the plan's every engine and
counted as they are; ``TrainDone`` (metrics) as it is. A trainer rank's bytes are its replica's (as
measured) plus the step's shared metadata (scaled: within ~2% of the full step's pickled, whose ids are a
few characters longer). The engines outnumber a step's groups at both
sizes (256 and 2,048 vs 256), so each engine holds one group a step in the simulation as at full
scale; how many ``TrainShard`` messages carry a step depends on how the groups fall over the
replicas, so their count (not their bytes, which are per sample) is approximate. Bytes are the mean
of the measured steps.

Routing capacity: the orchestrator's CPU seconds per step (process time: on a shared machine wall
time would count other processes' turns), without what the fake roles do (their unpickling, sample
building and answers' pickling are theirs), split into the per-engine part (``sync_engines``,
``_release_engines`` and the polls that take ``ServingWeights``; counted as is), the dealing of the
shards (``step_shards``: its cost grows with the step's samples and replicas, so it is timed again
at full scale: the step's metadata repeated 256 / groups times, dealt over every replica) and the rest
(scaled by 256 / groups); samples per step over that, the median of the measured steps.
What moe_grpo needs: a step's 2,048 samples every ``STEP_S`` (an assumption: async with two steps of
look-ahead on 2,048 engines, an 8k-token response decoding at ~100 tokens/s takes ~80 s, so a step
completes every ~30-60 s; 30 s is the demanding end).

Not covered: the wire's own time (printed at an assumed NIC bandwidth, not simulated), MPI's
buffering and rendezvous, the weight pushes (torch.distributed), the trainer's own collectives
(its loss mask's all-reduce over DP), env and reward-server traffic (moe_grpo has neither),
failures (``RescoreSamples``, re-queued episodes), evaluation and checkpoints.

    python bench/control_plane.py [--groups 8] [--steps 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import pickle
import random
import statistics
import time
import zlib
from collections import defaultdict
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from mpi4py import MPI

from hetrl.config import load_config
from hetrl.control import comm
from hetrl.control.comm import RoleContext, Tag
from hetrl.control.plan import make_plan
from hetrl.control.protocol import (
    DropSamples,
    MemoryReleased,
    ReleaseMemory,
    RewardDone,
    RewardWork,
    RolloutDone,
    RolloutWork,
    ScoredSample,
    ScoringView,
    ServingWeights,
    ShipSamples,
    Shutdown,
    SyncWeights,
    TrainDone,
    TrainerLayout,
    TrainShard,
    TrainWork,
)
from hetrl.env.envs.multimodal import make_scene, render_scene
from hetrl.loop import orchestrator as orchestrator_module
from hetrl.loop.orchestrator import Orchestrator
from hetrl.models.images import to_png
from hetrl.records import CONVERSATION_KEY, ENV_REWARD_KEY, EpisodeItem, Sample, SampleMeta
from hetrl.trainer.shards import step_shards

NODE_COUNTS = (128, 1024)
HEADLINE_NODES = 1024
GOAL_RATIO = 0.05
GOAL_TRAINER = 1.1
OVERRIDES = ["rollout.routing_replay=true"]  # R3: every sample carries its routing
STEP_S = 30.0  # moe_grpo's step at 1,024 nodes: an assumption (see the docstring)
NIC_BYTES_S = 25e9  # a 200 Gb/s NIC, the orchestrator's whole link
COMPLETION_MEDIAN_TOKENS, COMPLETION_SIGMA = 4000, 0.6
TEMPLATE_TOKENS = 20  # the chat template around a task's prompt
CHARS_PER_TOKEN = 4
NUM_TRAINER_METRICS = 64  # about what a TrainDone's metrics dict holds
SHARE_WORK = "share(TrainWork)"  # the leader's share of the step's metadata with every trainer rank
SHARE_SHARD = "share(TrainShard)"  # a receiver's share of its replica's samples with the replica's other ranks
# Counted as they are (messages and bytes): the messages to and from every engine, and the trainer's answer.
UNSCALED = {"SyncWeights", "ServingWeights", "ReleaseMemory", "MemoryReleased", "TrainDone"}
PER_STEP = {"TrainWork", SHARE_WORK}  # one message a step (to each trainer rank): only its bytes scale


# ------------------------------------------------------------------ the fake world


class _Done:
    """A completed request: an isend's or a broadcast's (``Test``), or a matched message's receive (``test``)."""

    def __init__(self, data: bytes = b"", on_receive: Any = None) -> None:
        self.data, self.on_receive = data, on_receive

    def Test(self) -> bool:  # noqa: N802 (mpi4py's name)
        return True

    def test(self) -> tuple[bool, Any]:
        self.on_receive()
        return True, pickle.loads(self.data)  # the orchestrator's unpickling: its cost


class _Matched:
    def __init__(self, request: _Done) -> None:
        self.request = request

    def irecv(self) -> _Done:
        return self.request


class Traffic:
    """Messages and bytes per (sender role, receiver role, message type)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])

    def add(self, sender: str, receiver: str, kind: str, num_bytes: int, messages: int = 1) -> None:
        entry = self.counts[sender, receiver, kind]
        entry[0] += messages
        entry[1] += num_bytes

    def snapshot(self) -> dict[tuple[str, str, str], tuple[int, int]]:
        return {key: (m, b) for key, (m, b) in self.counts.items()}


def wire_bytes(obj: Any) -> int:
    """What mpi4py puts on the wire for ``comm.send(obj)``: the envelope, pickled in mpi4py's protocol."""
    return len(pickle.dumps(comm.envelope(obj), MPI.pickle.PROTOCOL))


class FakeWorld:
    """The MPI world: the orchestrator's sends are pickled, counted and handed to the fake role of their
    destination (``handlers``); what the roles send the orchestrator (:meth:`post`) waits, pickled, for its next
    probe; what they send each other (:meth:`relay`) is counted. Time the roles spend is kept apart (``role_s``):
    it is not the orchestrator's."""

    def __init__(self, plan: Any, traffic: Traffic) -> None:
        self.plan, self.traffic = plan, traffic
        self.rank = plan.ranks_of("orchestrator")[0]
        self.handlers: dict[int, Callable[[int, Any], None]] = {}
        self.arrived: list[tuple[int, int, str, bytes]] = []  # (source, tag, message type, data)
        self.receiving = 0  # matched, not yet received
        self.role_s = 0.0
        self.last_received = ""  # the type of the message the orchestrator took last

    def Get_rank(self) -> int:  # noqa: N802
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.plan.world_size

    def role(self, rank: int) -> str:
        return self.plan.assignments[rank].role

    def isend(self, wrapped: Any, dest: int, tag: int) -> _Done:
        data = pickle.dumps(wrapped, MPI.pickle.PROTOCOL)  # mpi4py pickles in the sender: the orchestrator's cost
        self.traffic.add("orchestrator", self.role(dest), type(wrapped[1]).__name__, len(data))
        start = time.process_time()
        self.handlers[dest](dest, pickle.loads(data)[1])
        self.role_s += time.process_time() - start
        return _Done()

    def post(self, source: int, message: Any) -> None:
        """A role's message to the orchestrator (``Tag.RESULT``, as every role's to it)."""
        data = pickle.dumps(comm.envelope(message), MPI.pickle.PROTOCOL)
        kind = type(message).__name__
        self.traffic.add(self.role(source), "orchestrator", kind, len(data))
        self.arrived.append((source, int(Tag.RESULT), kind, data))

    def relay(self, source: int, dest: int, message: Any) -> int:
        """A role's message to another role, counted; returns its bytes (the caller hands it over)."""
        num_bytes = wire_bytes(message)
        self.traffic.add(self.role(source), self.role(dest), type(message).__name__, num_bytes)
        return num_bytes

    def Iprobe(self, source: int, tag: int) -> bool:  # noqa: N802
        if not self.arrived and not self.receiving:
            raise RuntimeError("the simulation stalled: the orchestrator waits for a message no fake role sends")
        return bool(self.arrived)

    def improbe(self, source: int, tag: int, status: Any) -> _Matched | None:
        if not self.arrived:
            return None
        sender, message_tag, kind, data = self.arrived.pop(0)
        status.Set_source(sender)
        status.Set_tag(message_tag)
        self.receiving += 1

        def received() -> None:
            self.receiving -= 1
            self.last_received = kind

        return _Matched(_Done(data, received))


class FakeComm:
    """A communicator as its root sees it: ``comm.share``'s broadcasts are counted (what each other rank receives)."""

    def __init__(self, size: int) -> None:
        self.size, self.broadcast = size, 0

    def Get_rank(self) -> int:  # noqa: N802
        return 0

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    def Ibcast(self, buffer: np.ndarray, root: int) -> _Done:  # noqa: N802
        self.broadcast += buffer.nbytes
        return _Done()

    def share(self, obj: Any) -> int:
        """``comm.share(self, obj)``; returns the bytes each other rank receives."""
        self.broadcast = 0
        comm.share(self, obj)
        return self.broadcast


# ------------------------------------------------------------------ the fake roles


class FakeEngines:
    """Every engine: generates samples shaped as moe_grpo's, keeps them, and sends them where the data plane says."""

    def __init__(self, cfg: Any, world: FakeWorld, rewards: FakeRewards, trainer: FakeTrainer, images: bool) -> None:
        self.cfg, self.world, self.rewards, self.trainer, self.images = cfg, world, rewards, trainer, images
        self.serving: dict[int, int] = defaultdict(int)
        self.held: dict[int, dict[str, Sample]] = defaultdict(dict)  # engine -> its samples by id
        self.routing_rows = (cfg.model.num_layers, cfg.model.moe_router_topk)
        self.routing_dtype = np.uint8 if cfg.model.num_experts <= 256 else np.uint16

    def __call__(self, rank: int, message: Any) -> None:
        if isinstance(message, RolloutWork):
            for item in message.items:  # one at a time: their lengths differ, they finish apart
                sample = self.sample(item, self.serving[rank])
                self.held[rank][sample.sample_id] = sample
                self.world.post(rank, RolloutDone([SampleMeta.of(sample)]))
                work = RewardWork([ScoringView.of(sample, self.cfg.reward.reads_completion_ids)])
                self.world.relay(rank, message.reward_rank, work)
                self.rewards(message.reward_rank, work)
        elif isinstance(message, ShipSamples):
            for receiver, metas in message.shards:
                shard = TrainShard(message.step, [m.scored(self.held[rank].pop(m.sample_id)) for m in metas])
                self.trainer.take_shard(receiver, shard, self.world.relay(rank, receiver, shard))
        elif isinstance(message, DropSamples):
            for sample_id in message.sample_ids:
                del self.held[rank][sample_id]
        elif isinstance(message, SyncWeights):
            self.serving[rank] = message.version
            self.world.post(rank, ServingWeights(message.version))
        elif isinstance(message, ReleaseMemory):
            self.world.post(rank, MemoryReleased())
        elif not isinstance(message, Shutdown):
            raise TypeError(f"engine got {type(message).__name__}")

    def sample(self, item: EpisodeItem, version: int) -> Sample:
        """One finished episode as ``hetrl.env.runner`` returns it (single turn, every token the policy's)."""
        rng = np.random.default_rng(zlib.crc32(item.sample_id.encode()))
        prompt = "".join(m["content"] for m in item.task.messages)
        num_prompt = len(prompt) // CHARS_PER_TOKEN + TEMPLATE_TOKENS
        cap = self.cfg.rollout.max_tokens
        n = min(cap, self.completion_tokens(item))
        text = rng.integers(97, 123, n * CHARS_PER_TOKEN, dtype=np.uint8).tobytes().decode("ascii")
        reward = float(rng.integers(0, 2))
        return Sample(
            sample_id=item.sample_id,
            group_id=item.group_id,
            task_name=item.task.source,
            prompt_ids=self.token_ids(rng, num_prompt),
            completion_ids=self.token_ids(rng, n),
            loss_mask=[1] * n,
            logprobs=(-rng.exponential(0.3, n)).tolist(),
            versions=[version] * n,
            finish_reason="stop" if n < cap else "length",
            prompt_text=prompt,
            completion_text=text,
            answer=item.task.answer,
            rewards={ENV_REWARD_KEY: reward},
            info={
                "turn_rewards": [reward],
                "stop_reason": "done",
                CONVERSATION_KEY: [{"role": "user", "content": prompt}, {"role": "assistant", "content": text}],
            },
            images=[scene_png(item.seed)] if self.images else [],
            routed_experts=rng.integers(
                0, self.cfg.model.num_experts, (num_prompt + n - 1, *self.routing_rows), dtype=self.routing_dtype
            ),
        )

    def completion_tokens(self, item: EpisodeItem) -> int:
        """The sample's response length: a quantile of the log-normal, by the sample's place in its step (group
        number modulo the step's groups, index in the group), so that every step holds the same lengths."""
        group_size = self.cfg.algorithm.group_size
        place = int(item.group_id[1:]) % self.cfg.run.prompts_per_step * group_size + int(item.sample_id.split(".")[1])
        quantile = (place + 0.5) / (self.cfg.run.prompts_per_step * group_size)
        z = statistics.NormalDist().inv_cdf(quantile)
        return max(1, int(COMPLETION_MEDIAN_TOKENS * np.exp(COMPLETION_SIGMA * z)))

    def token_ids(self, rng: np.random.Generator, num_tokens: int) -> list[int]:
        # Log-uniform over [1000, vocab): about one id in six above 65,535 (5 pickled bytes, 3 below).
        vocab = self.cfg.model.vocab_size
        return np.exp(rng.uniform(np.log(1000), np.log(vocab), num_tokens)).astype(np.int64).tolist()


class FakeRewards:
    """Every reward rank: a verdict per scoring view, to the orchestrator."""

    def __init__(self, world: FakeWorld) -> None:
        self.world = world

    def __call__(self, rank: int, message: Any) -> None:
        if isinstance(message, Shutdown):
            return
        if not isinstance(message, RewardWork):
            raise TypeError(f"reward rank got {type(message).__name__}")
        scored = []
        for view in message.views:
            value = view.rewards.get(ENV_REWARD_KEY, 0.0)
            rewards = {**view.rewards, "math": value}
            scored.append(ScoredSample(view.sample_id, rewards, value, [], {"math/parsed": 1.0, "math/correct": value}))
        self.world.post(rank, RewardDone(scored, score_s=0.05))


class Replica(NamedTuple):
    """One data-parallel replica's bytes in one step: what its receiver received (TrainShards), what each of its
    other ranks received (the receiver's share), and its shard (its samples pickled)."""

    received: int
    shared: int
    shard: int


class FakeTrainer:
    """The trainer's leader and every replica's receiver; per step, what each trainer rank received."""

    def __init__(self, cfg: Any, plan: Any, world: FakeWorld, traffic: Traffic, num_replicas: int) -> None:
        self.cfg, self.world, self.traffic = cfg, world, traffic
        layout = plan.trainer
        ranks = plan.ranks_of("trainer")
        self.leader = ranks[0]
        self.everyone = FakeComm(len(ranks))
        self.replica = FakeComm(layout.tensor_parallel * layout.pipeline_parallel * layout.context_parallel)
        stride = layout.tensor_parallel * layout.context_parallel  # tp-cp-ep-dp-pp: replica d starts at d x TP x CP
        self.receivers = [ranks[d * stride] for d in range(num_replicas)]
        self.inbox: dict[int, list[tuple[TrainShard, int]]] = defaultdict(list)  # receiver -> (shard, bytes)
        self.version = 0
        self.steps: list[dict[str, Any]] = []  # per TrainWork: what the trainer ranks received, the batch
        world.post(self.leader, TrainerLayout(self.receivers, None, cfg.trainer.shared_prompts))

    def take_shard(self, receiver: int, shard: TrainShard, num_bytes: int) -> None:
        if receiver not in self.receivers:
            raise RuntimeError(f"a TrainShard went to world rank {receiver}, no replica's receiver")
        self.inbox[receiver].append((shard, num_bytes))

    def __call__(self, rank: int, message: Any) -> None:
        if isinstance(message, TrainWork):
            self.train(message)
        elif not isinstance(message, Shutdown):
            raise TypeError(f"trainer got {type(message).__name__}")

    def train(self, work: TrainWork) -> None:
        """Share the header, check each replica's shard against the trainer's own dealing, share it, answer."""
        shared = self.everyone.share(work)  # the leader hands it to every trainer rank
        others = self.everyone.size - 1
        self.traffic.add("trainer", "trainer", SHARE_WORK, others * shared, messages=others)
        metas = work.metas
        order = {m.sample_id: i for i, m in enumerate(metas)}
        num_minibatches = 1 if work.supervised else self.cfg.trainer.updates_per_batch
        samples: dict[str, Sample] = {}
        replicas = []
        shards = step_shards(metas, num_minibatches, len(self.receivers), None, self.cfg.trainer.shared_prompts)
        for dp_rank, (receiver, dealt) in enumerate(zip(self.receivers, shards)):
            got = self.inbox.pop(receiver, [])
            shard = sorted((s for message, _ in got for s in message.samples), key=lambda s: order[s.sample_id])
            if [order[s.sample_id] for s in shard] != dealt:
                raise RuntimeError(f"step {work.step}: replica {dp_rank} received other samples than its shard")
            samples.update((s.sample_id, s) for s in shard)
            replica_bytes = self.replica.share(shard)
            peers = self.replica.size - 1
            self.traffic.add("trainer", "trainer", SHARE_SHARD, peers * replica_bytes, messages=peers)
            shard_bytes = len(pickle.dumps(shard, MPI.pickle.PROTOCOL))
            replicas.append(Replica(sum(n for _, n in got), replica_bytes, shard_bytes))
        if self.inbox:
            raise RuntimeError(f"step {work.step}: TrainShards for no replica of its layout: {sorted(self.inbox)}")
        batch = [samples[m.sample_id] for m in metas]
        self.steps.append(
            {
                "header": shared,
                "leader": wire_bytes(work),
                "replicas": replicas,
                "batch_bytes": len(pickle.dumps(batch, MPI.pickle.PROTOCOL)),
                "lengths": [(len(s.prompt_ids), len(s.completion_ids)) for s in batch],
                "routing_bytes": statistics.mean(s.routed_experts.nbytes for s in batch),
                "metas": metas,
            }
        )
        self.version += 1
        metrics = {f"train/metric_{i}": i / 7 for i in range(NUM_TRAINER_METRICS)}
        self.world.post(self.leader, TrainDone(work.step, self.version, metrics))


def scene_png(seed: int) -> bytes:
    """One image of the multimodal env (tiny_vlm_grpo's shapes, which_colour scenes), as samples carry it."""
    shapes, _, _ = make_scene(random.Random(seed), ("which_colour",), 3, 8, fill=True)
    return to_png(render_scene(shapes))


# ------------------------------------------------------------------ the simulated steps


class _Tokenizer:
    eos_token_id = 2  # all the orchestrator reads of a tokenizer (its sampling's stop id)


class EngineClock:
    """The orchestrator's seconds on the messages to and from every engine (they do not scale with the step's
    samples), read by wrapping the instance's own methods from outside; fake roles' time is left out."""

    def __init__(self, orch: Orchestrator, world: FakeWorld) -> None:
        self.world, self.seconds, self.inside = world, 0.0, False
        orch.sync_engines = self.wrap(orch.sync_engines, always=True)
        orch._release_engines = self.wrap(orch._release_engines, always=True)
        orch.pump = self.wrap(orch.pump, always=False)  # those that took a ServingWeights or MemoryReleased

    def wrap(self, method: Any, always: bool) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.inside:
                return method(*args, **kwargs)
            self.inside, start, role_s = True, time.process_time(), self.world.role_s
            try:
                return method(*args, **kwargs)
            finally:
                self.inside = False
                if always or self.world.last_received in UNSCALED:
                    self.seconds += time.process_time() - start - (self.world.role_s - role_s)

        return timed


class DealClock:
    """The orchestrator's seconds in ``step_shards`` (its dealing of a step over the replicas), read by standing in
    for the name its module calls while the simulation runs."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> DealClock:
        def timed(*args: Any, **kwargs: Any) -> list[list[int]]:
            start = time.process_time()
            try:
                return step_shards(*args, **kwargs)
            finally:
                self.seconds += time.process_time() - start

        orchestrator_module.step_shards = timed
        return self

    def __exit__(self, *exc: object) -> None:
        orchestrator_module.step_shards = step_shards


def full_deal_s(metas: list[SampleMeta], copies: int, num_replicas: int, cfg: Any) -> float:
    """CPU seconds to deal a full step (``metas`` repeated ``copies`` times under fresh ids) over ``num_replicas``
    replicas, as the orchestrator deals it: one ``step_shards`` for every replica."""
    full = [
        dataclasses.replace(m, sample_id=f"{m.sample_id}-{k}", group_id=f"{m.group_id}-{k}")
        for k in range(copies)
        for m in metas
    ]
    start = time.process_time()
    step_shards(full, cfg.trainer.updates_per_batch, num_replicas, None, cfg.trainer.shared_prompts)
    return time.process_time() - start


def simulate(nodes: int, groups: int, steps: int, images: bool, fill_steps: int) -> dict:
    """``fill_steps`` + ``steps`` RL steps of moe_grpo on the real orchestrator, ``groups`` prompt groups each;
    per measured step: the traffic at full scale, the orchestrator's seconds for a full step, the trainer ranks'
    bytes (its replicas' as measured, the shared metadata at full scale)."""
    full_cfg = load_config("moe_grpo", [f"nodes={nodes}", *OVERRIDES])
    plan = make_plan(full_cfg)
    cfg = load_config("moe_grpo", [f"nodes={nodes}", *OVERRIDES, f"run.prompts_per_step={groups}"])
    copies, remainder = divmod(full_cfg.run.prompts_per_step, groups)
    num_replicas, replica_remainder = divmod(plan.trainer.data_parallel * groups, full_cfg.run.prompts_per_step)
    if remainder or replica_remainder or not num_replicas:
        raise ValueError(
            f"--groups {groups}: must divide the recipe's {full_cfg.run.prompts_per_step} groups and leave a whole "
            f"number of the {plan.trainer.data_parallel} data-parallel replicas ({nodes:,} nodes)"
        )
    traffic = Traffic()
    world = FakeWorld(plan, traffic)
    rewards = FakeRewards(world)
    trainer = FakeTrainer(cfg, plan, world, traffic, num_replicas)
    engines = FakeEngines(cfg, world, rewards, trainer, images)
    world.handlers = {
        **dict.fromkeys(plan.ranks_of("rollout"), engines),
        **dict.fromkeys(plan.ranks_of("reward"), rewards),
        trainer.leader: trainer,
    }
    orch = Orchestrator(RoleContext(world, None, plan, plan.assignments[world.rank]), cfg, None, _Tokenizer())
    clock = EngineClock(orch, world)
    measured = []
    with DealClock() as deal:
        for step in range(fill_steps + steps):
            before, clock.seconds, deal.seconds = traffic.snapshot(), 0.0, 0.0
            start, role_s = time.process_time(), world.role_s
            max_lag = orch.staleness_bound()
            target = orch.dispatch_target(max_lag)
            orch.top_up(target)
            batch, dropped_stale, dropped_equal = orch.collect_batch(max_lag, target)
            if dropped_stale or dropped_equal:
                raise RuntimeError(f"step {step} dropped {dropped_stale} stale samples, {dropped_equal} groups")
            orch.train(step, batch)
            seconds = time.process_time() - start - (world.role_s - role_s)
            if step < fill_steps:
                continue
            delta = {}
            for key, (messages, num_bytes) in traffic.snapshot().items():
                old = before.get(key, (0, 0))
                if messages == old[0]:
                    continue
                delta[key] = (
                    (messages - old[0]) * (1 if key[2] in UNSCALED | PER_STEP else copies),
                    (num_bytes - old[1]) * (1 if key[2] in UNSCALED else copies),
                )
            trained = trainer.steps[step]
            measured.append(
                {
                    "traffic": delta,
                    "orchestrator_s": copies * (seconds - clock.seconds - deal.seconds) + clock.seconds,
                    "batch_bytes": trained["batch_bytes"] * copies,
                    "header": trained["header"] * copies,
                    "leader": trained["leader"] * copies,
                    "replicas": trained["replicas"],
                }
            )
    deal_s = full_deal_s(trainer.steps[-1]["metas"], copies, plan.trainer.data_parallel, cfg)
    for step in measured:
        step["orchestrator_s"] += deal_s
    return {
        "nodes": nodes,
        "plan": plan,
        "prompts": full_cfg.run.prompts_per_step,
        "samples": full_cfg.run.prompts_per_step * full_cfg.algorithm.group_size,
        "steps": measured,
        "deal_s": deal_s,
        "lengths": trainer.steps[-1]["lengths"],
        "routing_bytes": trainer.steps[-1]["routing_bytes"],
    }


def trainer_ranks(step: dict) -> dict[str, list[float]]:
    """Bytes each simulated trainer rank received in ``step``, and its replica's shard bytes: receivers (the leader,
    replica 0's, takes the TrainWork itself), other ranks (one per replica: they all receive the same)."""
    receivers, others, shards = [], [], []
    for dp_rank, replica in enumerate(step["replicas"]):
        receivers.append((step["leader"] if dp_rank == 0 else step["header"]) + replica.received)
        others.append(step["header"] + replica.shared)
        shards.append(replica.shard)
    return {"receivers": receivers, "others": others, "shards": shards}


def mean_step(run: dict) -> dict:
    """The measured steps' mean traffic (messages and bytes per key), batch bytes and trainer ranks' bytes; the
    most any trainer rank received over its shard (the largest of the steps); the median orchestrator seconds."""
    steps = run["steps"]
    keys = {key for step in steps for key in step["traffic"]}
    traffic = {
        key: tuple(statistics.mean(step["traffic"].get(key, (0, 0))[i] for step in steps) for i in (0, 1))
        for key in keys
    }
    ranks = [trainer_ranks(step) for step in steps]
    ratios = [
        max(max(r, o) / s for r, o, s in zip(rank["receivers"], rank["others"], rank["shards"])) for rank in ranks
    ]
    return {
        "traffic": traffic,
        "batch_bytes": statistics.mean(step["batch_bytes"] for step in steps),
        "header": statistics.mean(step["header"] for step in steps),
        "receiver": statistics.mean(b for rank in ranks for b in rank["receivers"]),
        "other": statistics.mean(b for rank in ranks for b in rank["others"]),
        "shard": statistics.mean(b for rank in ranks for b in rank["shards"]),
        "replica_share": statistics.mean(r.shared for step in steps for r in step["replicas"]),
        "trainer_ratio": max(ratios),
        "orchestrator_s": statistics.median(step["orchestrator_s"] for step in steps),
    }


def orchestrator_bytes(traffic: dict) -> tuple[float, float]:
    sent = sum(b for (src, _, _), (_, b) in traffic.items() if src == "orchestrator")
    received = sum(b for (_, dst, _), (_, b) in traffic.items() if dst == "orchestrator")
    return sent, received


# ------------------------------------------------------------------ the report


def gib(num_bytes: float) -> str:
    """``num_bytes`` in the largest binary unit that keeps it at 1 or more (KiB at least)."""
    for unit, power in (("GiB", 30), ("MiB", 20)):
        if num_bytes >= 2**power:
            return f"{num_bytes / 2**power:.2f} {unit}"
    return f"{num_bytes / 2**10:.1f} KiB"


def report_nodes(run: dict, step: dict) -> float:
    """The traffic of one step at ``run``'s size, by message and per rank; returns orchestrator bytes / batch."""
    plan, traffic, batch = run["plan"], step["traffic"], step["batch_bytes"]
    layout = plan.trainer
    sizes = plan.role_sizes()
    print(
        f"\n{run['nodes']:,} nodes: {sizes['trainer']:,} trainer ranks (DP {layout.data_parallel:,} replicas of "
        f"{layout.world_size // layout.data_parallel}), {sizes['rollout']:,} engines, {sizes['reward']} reward ranks, "
        f"orchestrator 1; batch {gib(batch)} a step"
    )
    print(f"  {'message':<17} {'from':<12} {'to':<12} {'msgs/step':>10} {'bytes/step':>11} {'x batch':>8}")
    for (src, dst, kind), (messages, num_bytes) in sorted(traffic.items(), key=lambda kv: -kv[1][1]):
        print(f"  {kind:<17} {src:<12} {dst:<12} {messages:>10,.0f} {gib(num_bytes):>11} {num_bytes / batch:>7.3f}x")
    for role in ("rollout", "reward"):
        received = sum(b for (_, dst, _), (_, b) in traffic.items() if dst == role)
        sent = sum(b for (src, _, _), (_, b) in traffic.items() if src == role)
        ranks = sizes[role]
        each = f"receives {gib(received / ranks)}, sends {gib(sent / ranks)}"
        print(f"  a {role} rank (mean of {ranks:,}): {each} a step")
    print(
        f"  a replica's receiver (mean of {layout.data_parallel:,}): receives {gib(step['receiver'])} (the shared "
        f"metadata {gib(step['header'])} + its TrainShards), sends {gib(step['replica_share'])} (its shard, into its "
        f"replica's share); its shard: {gib(step['shard'])}"
    )
    print(
        f"  any other trainer rank: receives {gib(step['other'])} (the shared metadata + its replica's share), "
        f"sends nothing counted (a broadcast's forwarding is not)"
    )
    sent, received = orchestrator_bytes(traffic)
    ratio = (sent + received) / batch
    print(
        f"  orchestrator: sends {gib(sent)} + receives {gib(received)} a step = {ratio:.4f}x the batch; "
        f"{(sent + received) / NIC_BYTES_S * 1e3:.2f} ms a step on the wire alone at {NIC_BYTES_S / 1e9:.0f} GB/s"
    )
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=8, help="prompt groups simulated a step (of the recipe's 256)")
    parser.add_argument("--steps", type=int, default=5, help="measured steps, after the look-ahead's fill")
    args = parser.parse_args()
    fill_steps = 1 + load_config("moe_grpo", OVERRIDES).schedule.max_staleness  # the async look-ahead's steps
    runs = {nodes: simulate(nodes, args.groups, args.steps, False, fill_steps) for nodes in NODE_COUNTS}
    headline = runs[HEADLINE_NODES]
    prompts, completions = zip(*headline["lengths"])
    print(
        f"moe_grpo, R3 on: {headline['samples']:,} samples a step; simulated {args.groups} of {headline['prompts']} "
        f"groups a step (x{headline['prompts'] / args.groups:g}), {fill_steps} steps to fill the look-ahead, "
        f"then {args.steps} measured; "
        f"last step's samples: mean {statistics.mean(prompts):.0f} prompt + {statistics.mean(completions):.0f} "
        f"completion tokens (log-normal, median {COMPLETION_MEDIAN_TOKENS:,}, sigma {COMPLETION_SIGMA}, cap 8,192), "
        f"routing {headline['routing_bytes'] / 2**20:.2f} MiB a sample"
    )
    steps = {nodes: mean_step(run) for nodes, run in runs.items()}
    ratios = {nodes: report_nodes(runs[nodes], steps[nodes]) for nodes in NODE_COUNTS}
    vlm = mean_step(simulate(HEADLINE_NODES, args.groups, args.steps, True, fill_steps))
    vlm_ratio = sum(orchestrator_bytes(vlm["traffic"])) / vlm["batch_bytes"]
    print(
        f"\nVLM variant ({HEADLINE_NODES:,} nodes, one {len(scene_png(0)):,}-byte PNG scene per sample, as "
        f"tiny_vlm_grpo's multimodal env encodes it): batch {gib(vlm['batch_bytes'])}, orchestrator "
        f"{vlm_ratio:.4f}x the batch, a trainer rank at most {vlm['trainer_ratio']:.3f}x its shard"
    )
    need = headline["samples"] / STEP_S
    capacity = {nodes: runs[nodes]["samples"] / steps[nodes]["orchestrator_s"] for nodes in NODE_COUNTS}
    print(
        f"routing capacity: {capacity[128]:,.0f} / {capacity[1024]:,.0f} samples/s at 128 / 1,024 nodes "
        f"(median of {args.steps} steps, the orchestrator's CPU time: pickling, unpickling, bookkeeping, dealing the "
        f"shards; {steps[1024]['orchestrator_s']:.2f} s a step at 1,024 nodes, of which dealing "
        f"{headline['deal_s']:.2f} s) vs {need:,.0f} samples/s moe_grpo needs at 1,024 nodes "
        f"({headline['samples']:,} samples per {STEP_S:g} s step): {capacity[1024] / need:.2f}x"
    )
    top = steps[HEADLINE_NODES]
    print(
        f"trainer rank: {top['trainer_ratio']:.3f}x its DP shard's bytes at {HEADLINE_NODES:,} nodes (goal <= "
        f"{GOAL_TRAINER}): the most any trainer rank receives a step (the shared metadata {gib(top['header'])} + its "
        f"replica's samples) over its shard's ({gib(top['shard'])}, mean)"
    )
    print(
        f"control_plane: {ratios[HEADLINE_NODES]:.4f}x of the batch through the orchestrator at 1,024 nodes "
        f"(goal <= {GOAL_RATIO})"
    )


if __name__ == "__main__":
    main()
