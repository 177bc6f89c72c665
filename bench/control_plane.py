"""Control plane: every byte a simulated ``moe_grpo`` step moves, and how many samples the orchestrator can route.

The real ``hetrl.loop.orchestrator.Orchestrator`` runs the recipe's async schedule (``top_up``,
``collect_batch``, ``train``, as ``hetrl.loop.driver.rl_step`` calls them) in this process, on the
real plan of 128 and 1,024 nodes (``hetrl.control.plan.make_plan``: its engines, reward ranks and
trainer ranks), with R3 on (``rollout.routing_replay``). Its MPI world is a fake that implements
what ``hetrl.control.comm`` calls (``isend``, ``Iprobe``, ``improbe`` ... ``irecv().test()``) and
pickles every message as mpi4py does (``MPI.pickle.PROTOCOL``, the envelope included): the bytes
counted are the wire's, per (sender, receiver, message type). Behind it, fake roles answer with the
real messages of ``hetrl.control.protocol``, as the real roles would:

* an engine answers each ``RolloutWork`` with one ``RolloutDone`` per sample (long-tailed lengths
  finish apart), each ``SyncWeights`` with ``ServingWeights`` and each ``ReleaseMemory`` (the
  recipe's engines are colocated) with ``MemoryReleased``; its samples are shaped as
  ``hetrl.env.runner`` builds them: the task's prompt (real gsm_symbolic tasks from the recipe's
  stream), token ids, per-token lists, decoded texts, the conversation for the rubric, and
  ``routed_experts`` uint8 [prompt + completion - 1, 48 MoE layers, top-8];
* a reward rank answers each ``RewardWork`` (the samples' scoring views) with a ``RewardDone`` of
  their verdicts (``ScoredSample``: rewards, flags, the rubric's metrics);
* the trainer's leader answers each ``TrainWork`` with a ``TrainDone`` (float32 log-probs per
  sample) after sharing it with the other trainer ranks through the real ``comm.share`` over a fake
  trainer communicator: each trainer rank receives the whole pickled ``TrainWork`` (and keeps its DP
  shard: a balanced shard is the batch / DP). The tree's sends are not counted per rank (a binomial
  tree: the leader sends log2(ranks) copies, the others fewer).

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
prompt groups with the real objects and scales by exact multiplicity: every message that carries
samples (rollout, reward, train, their answers, the share) is counted per sample, measured, and
multiplied by 256 / groups; the messages to and from every engine (``SyncWeights``,
``ReleaseMemory`` and their answers) are sent to the plan's every engine and counted as they are.
The engines outnumber a step's groups at both sizes (256 and 2,048 vs 256), so each engine gets
one group a step in the simulation as at full scale. Bytes are the mean of the measured steps.

Routing capacity: the orchestrator's CPU seconds per step (process time: on a shared machine wall
time would count other processes' turns), without what the fake roles do (their unpickling, sample
building and answers' pickling are theirs), split into the per-engine part (``sync_engines``,
``_release_engines`` and the polls that take ``ServingWeights``; counted as is) and the rest
(scaled by 256 / groups); samples per step over that, the median of the measured steps.
What moe_grpo needs: a step's 2,048 samples every ``STEP_S`` (an assumption: async with two steps of
look-ahead on 2,048 engines, an 8k-token response decoding at ~100 tokens/s takes ~80 s, so a step
completes every ~30-60 s; 30 s is the demanding end).

Not covered: the wire's own time (printed at an assumed NIC bandwidth, not simulated), MPI's
buffering and rendezvous, the weight pushes (torch.distributed), env and reward-server traffic
(moe_grpo has neither), evaluation and checkpoints.

    python bench/control_plane.py [--groups 8] [--steps 5]
"""

from __future__ import annotations

import argparse
import pickle
import random
import statistics
import time
import zlib
from collections import defaultdict
from typing import Any

import numpy as np
from mpi4py import MPI

from hetrl.config import load_config
from hetrl.control import comm
from hetrl.control.comm import RoleContext, Tag
from hetrl.control.plan import make_plan
from hetrl.control.protocol import (
    MemoryReleased,
    ReleaseMemory,
    RewardDone,
    RewardWork,
    RolloutDone,
    RolloutWork,
    ScoredSample,
    ServingWeights,
    Shutdown,
    SyncWeights,
    TrainDone,
    TrainWork,
)
from hetrl.env.envs.multimodal import make_scene, render_scene
from hetrl.loop.orchestrator import Orchestrator
from hetrl.models.images import to_png
from hetrl.records import CONVERSATION_KEY, ENV_REWARD_KEY, EpisodeItem, Sample

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
# Messages to and from every engine, whatever the step's size; all others carry samples.
PER_ENGINE = {"SyncWeights", "ServingWeights", "ReleaseMemory", "MemoryReleased"}
SHARE = "share(TrainWork)"
PER_STEP = {"TrainWork", "TrainDone", SHARE}  # one message a step (to each trainer rank): only its bytes scale


# ------------------------------------------------------------------ the fake world


class _Done:
    """A completed request: an isend's (``Test``) or a matched message's receive (``test``)."""

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
    """The orchestrator's MPI world: sends are pickled, counted and handed to the fake role of their
    destination, whose answers wait, pickled, for the orchestrator's next probe. Time the roles spend
    is kept apart (``role_s``): it is not the orchestrator's."""

    def __init__(self, plan: Any, roles: dict[int, Any], traffic: Traffic) -> None:
        self.plan, self.roles, self.traffic = plan, roles, traffic
        self.rank = plan.ranks_of("orchestrator")[0]
        self.arrived: list[tuple[int, Any, bytes]] = []  # (source, message type, data)
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
        message = wrapped[1]
        self.traffic.add("orchestrator", self.role(dest), type(message).__name__, len(data))
        start = time.process_time()
        for answer in self.roles[dest](dest, pickle.loads(data)[1]):
            self.arrived.append((dest, type(answer).__name__, pickle.dumps(comm.envelope(answer), MPI.pickle.PROTOCOL)))
            self.traffic.add(self.role(dest), "orchestrator", type(answer).__name__, len(self.arrived[-1][2]))
        self.role_s += time.process_time() - start
        return _Done()

    def Iprobe(self, source: int, tag: int) -> bool:  # noqa: N802
        if not self.arrived and not self.receiving:
            raise RuntimeError("the simulation stalled: the orchestrator waits for a message no fake role sends")
        return bool(self.arrived)

    def improbe(self, source: int, tag: int, status: Any) -> _Matched | None:
        if not self.arrived:
            return None
        sender, kind, data = self.arrived.pop(0)
        status.Set_source(sender)
        status.Set_tag(int(Tag.RESULT))
        self.receiving += 1

        def received() -> None:
            self.receiving -= 1
            self.last_received = kind

        return _Matched(_Done(data, received))


class FakeTrainerComm:
    """The trainer ranks' communicator as their leader sees it: ``comm.share``'s broadcasts are counted."""

    def __init__(self, size: int) -> None:
        self.size, self.broadcast = size, 0

    def Get_rank(self) -> int:  # noqa: N802
        return 0

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    def Ibcast(self, buffer: np.ndarray, root: int) -> _Done:  # noqa: N802
        self.broadcast += buffer.nbytes  # what every other trainer rank receives
        return _Done()


# ------------------------------------------------------------------ the fake roles


class FakeRoles:
    """What the engines, reward ranks and trainer leader answer; samples shaped as moe_grpo's."""

    def __init__(self, cfg: Any, plan: Any, traffic: Traffic, images: bool) -> None:
        self.cfg, self.plan, self.traffic, self.images = cfg, plan, traffic, images
        self.serving: dict[int, int] = defaultdict(int)
        self.trainer_comm = FakeTrainerComm(len(plan.ranks_of("trainer")))
        self.version = 0
        self.batch_bytes: list[int] = []  # per TrainWork: its samples pickled
        self.share_bytes: list[int] = []  # per TrainWork: what each other trainer rank receives
        self.routing_rows = (cfg.model.num_layers, cfg.model.moe_router_topk)
        self.routing_dtype = np.uint8 if cfg.model.num_experts <= 256 else np.uint16

    def table(self) -> dict[int, Any]:
        handlers = dict.fromkeys(self.plan.ranks_of("rollout"), self.engine)
        handlers.update(dict.fromkeys(self.plan.ranks_of("reward"), self.reward))
        handlers[self.plan.ranks_of("trainer")[0]] = self.trainer
        return handlers

    def engine(self, rank: int, message: Any) -> list[Any]:
        if isinstance(message, RolloutWork):
            return [RolloutDone([self.sample(item, self.serving[rank])]) for item in message.items]
        if isinstance(message, SyncWeights):
            self.serving[rank] = message.version
            return [ServingWeights(message.version)]
        if isinstance(message, ReleaseMemory):
            return [MemoryReleased()]
        if isinstance(message, Shutdown):
            return []
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

    def reward(self, rank: int, message: Any) -> list[Any]:
        if isinstance(message, Shutdown):
            return []
        if not isinstance(message, RewardWork):
            raise TypeError(f"reward rank got {type(message).__name__}")
        scored = []
        for view in message.views:
            value = view.rewards.get(ENV_REWARD_KEY, 0.0)
            rewards = {**view.rewards, "math": value}
            scored.append(ScoredSample(view.sample_id, rewards, value, [], {"math/parsed": 1.0, "math/correct": value}))
        return [RewardDone(scored, score_s=0.05)]

    def trainer(self, rank: int, message: Any) -> list[Any]:
        if isinstance(message, Shutdown):
            return []
        if not isinstance(message, TrainWork):
            raise TypeError(f"trainer got {type(message).__name__}")
        self.batch_bytes.append(len(pickle.dumps(message.samples, MPI.pickle.PROTOCOL)))
        before = self.trainer_comm.broadcast
        comm.share(self.trainer_comm, message)  # the leader hands it to every trainer rank
        self.share_bytes.append(self.trainer_comm.broadcast - before)
        others = self.trainer_comm.size - 1
        self.traffic.add("trainer", "trainer", SHARE, others * self.share_bytes[-1], messages=others)
        self.version += 1
        logprobs = [
            (-np.random.default_rng(0).exponential(0.3, len(s.completion_ids))).astype(np.float32)
            for s in message.samples
        ]
        metrics = {f"train/metric_{i}": i / 7 for i in range(NUM_TRAINER_METRICS)}
        return [TrainDone(message.step, self.version, metrics, logprobs)]


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
                if always or self.world.last_received in PER_ENGINE:
                    self.seconds += time.process_time() - start - (self.world.role_s - role_s)

        return timed


def simulate(nodes: int, groups: int, steps: int, images: bool, fill_steps: int) -> dict:
    """``fill_steps`` + ``steps`` RL steps of moe_grpo on the real orchestrator, ``groups`` prompt groups each;
    per measured step: the traffic at full scale, the orchestrator's seconds for a full step, the batch bytes."""
    full_cfg = load_config("moe_grpo", [f"nodes={nodes}", *OVERRIDES])
    plan = make_plan(full_cfg)
    cfg = load_config("moe_grpo", [f"nodes={nodes}", *OVERRIDES, f"run.prompts_per_step={groups}"])
    scale = full_cfg.run.prompts_per_step / groups
    traffic = Traffic()
    roles = FakeRoles(cfg, plan, traffic, images)
    world = FakeWorld(plan, roles.table(), traffic)
    orch = Orchestrator(RoleContext(world, None, plan, plan.assignments[world.rank]), cfg, None, _Tokenizer())
    clock = EngineClock(orch, world)
    measured = []
    for step in range(fill_steps + steps):
        before, clock.seconds = traffic.snapshot(), 0.0
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
        after = traffic.snapshot()
        delta = {}
        for key, (messages, num_bytes) in after.items():
            old = before.get(key, (0, 0))
            count_factor = 1 if key[2] in PER_ENGINE | PER_STEP else scale
            delta[key] = (
                (messages - old[0]) * count_factor,
                (num_bytes - old[1]) * (1 if key[2] in PER_ENGINE else scale),
            )
        measured.append(
            {
                "traffic": delta,
                "orchestrator_s": scale * (seconds - clock.seconds) + clock.seconds,
                "batch_bytes": roles.batch_bytes[step] * scale,
                "share_bytes": roles.share_bytes[step] * scale,
            }
        )
    return {
        "nodes": nodes,
        "plan": plan,
        "prompts": full_cfg.run.prompts_per_step,
        "samples": full_cfg.run.prompts_per_step * full_cfg.algorithm.group_size,
        "steps": measured,
        "lengths": [(len(s.prompt_ids), len(s.completion_ids)) for g in batch for s in g],
        "routing_bytes": statistics.mean(s.routed_experts.nbytes for g in batch for s in g),
    }


def mean_step(run: dict) -> dict:
    """The measured steps' mean traffic (messages and bytes per key) and batch bytes."""
    steps = run["steps"]
    keys = {key for step in steps for key in step["traffic"]}
    traffic = {
        key: tuple(statistics.mean(step["traffic"].get(key, (0, 0))[i] for step in steps) for i in (0, 1))
        for key in keys
    }
    return {
        "traffic": traffic,
        "batch_bytes": statistics.mean(step["batch_bytes"] for step in steps),
        "share_bytes": statistics.mean(step["share_bytes"] for step in steps),
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
        f"\n{run['nodes']:,} nodes: {sizes['trainer']:,} trainer ranks (DP {layout.data_parallel:,}), "
        f"{sizes['rollout']:,} engines, {sizes['reward']} reward ranks, orchestrator 1; batch {gib(batch)} a step"
    )
    print(f"  {'message':<17} {'from':<12} {'to':<12} {'msgs/step':>10} {'bytes/step':>11} {'x batch':>8}")
    for (src, dst, kind), (messages, num_bytes) in sorted(traffic.items(), key=lambda kv: -kv[1][1]):
        print(f"  {kind:<17} {src:<12} {dst:<12} {messages:>10,.0f} {gib(num_bytes):>11} {num_bytes / batch:>7.2f}x")
    for role in ("rollout", "reward", "trainer"):
        received = sum(b for (s, d, k), (_, b) in traffic.items() if d == role and k != SHARE)
        sent = sum(b for (s, d, k), (_, b) in traffic.items() if s == role and k != SHARE)
        ranks = 1 if role == "trainer" else sizes[role]
        who = "the trainer leader" if role == "trainer" else f"a {role} rank (mean of {ranks:,})"
        print(f"  {who}: receives {gib(received / ranks)}, sends {gib(sent / ranks)} a step")
    print(f"  every other trainer rank: receives {gib(step['share_bytes'])} a step (the whole TrainWork, shared)")
    sent, received = orchestrator_bytes(traffic)
    ratio = (sent + received) / batch
    print(
        f"  orchestrator: sends {gib(sent)} + receives {gib(received)} a step = {ratio:.2f}x the batch; "
        f"{(sent + received) / NIC_BYTES_S:.2f} s a step on the wire alone at {NIC_BYTES_S / 1e9:.0f} GB/s"
    )
    return ratio


def trainer_ratio(run: dict, step: dict) -> float:
    """The most bytes any trainer rank receives a step over its DP shard's (the batch / DP, a balanced shard's)."""
    leader = step["traffic"].get(("orchestrator", "trainer", "TrainWork"), (0, 0))[1]
    shard = step["batch_bytes"] / run["plan"].trainer.data_parallel
    return max(leader, step["share_bytes"]) / shard


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
        f"{vlm_ratio:.2f}x the batch"
    )
    need = headline["samples"] / STEP_S
    capacity = {nodes: runs[nodes]["samples"] / steps[nodes]["orchestrator_s"] for nodes in NODE_COUNTS}
    print(
        f"routing capacity: {capacity[128]:,.0f} / {capacity[1024]:,.0f} samples/s at 128 / 1,024 nodes "
        f"(median of {args.steps} steps, the orchestrator's CPU time: pickling, unpickling, bookkeeping; "
        f"{steps[1024]['orchestrator_s']:.1f} s a step at 1,024 nodes) vs {need:,.0f} samples/s moe_grpo needs at "
        f"1,024 nodes ({headline['samples']:,} samples per {STEP_S:g} s step): {capacity[1024] / need:.2f}x"
    )
    trainer = trainer_ratio(headline, steps[HEADLINE_NODES])
    print(
        f"trainer rank: {trainer:,.0f}x its DP shard's bytes at {HEADLINE_NODES:,} nodes (goal <= {GOAL_TRAINER}): "
        f"every trainer rank receives the whole step ({gib(steps[HEADLINE_NODES]['share_bytes'])})"
    )
    print(
        f"control_plane: {ratios[HEADLINE_NODES]:.2f}x of the batch through the orchestrator at 1,024 nodes "
        f"(goal <= {GOAL_RATIO})"
    )


if __name__ == "__main__":
    main()
