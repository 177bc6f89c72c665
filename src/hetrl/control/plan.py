"""The placement plan: which process runs which role on which node and GPUs.

Computed once from the validated config, before anything is submitted, and written into the run
directory; every process reads the same plan and finds its role from its MPI world rank. The rank
order follows srun's block distribution inside each heterogeneous component (ranks of a node are
consecutive), so the same table is right under ``mpiexec`` and under ``srun --het-group``.

Layout rules (each violation raises :class:`PlanError` saying why and suggesting a valid choice):
  * trainer world = trainer nodes x GPUs per node = TP x PP x CP x DP; experts add EP, which
    must divide the world with TP x PP (Megatron's expert-parallel groups) and the expert count;
  * TP divides the attention heads, the KV heads and the MLP width, and stays inside a node;
    PP divides the layers;
  * an engine's TP divides the GPUs of a node; colocated engines tile the trainer's GPUs,
    disaggregated engines get nodes of their own;
  * reward servers (the frozen judge / reward model, when the rubric uses one) get GPU nodes of
    their own on ``reward.server.partition``, ``gpus_per_node / reward.server.tensor_parallel``
    replicas a node; on a CPU profile each replica is one local process;
  * reward/verifier/sandbox workers, env servers (``env.placement=role``) and the orchestrator
    live on the CPU partition, in one component: per node its reward workers, then its env
    servers; the orchestrator is one extra task after them, on the first node.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hetrl.config.schema import HetrlConfig
from hetrl.control import rundir

ROLES = ("trainer", "rollout", "reward_server", "reward", "env", "orchestrator")
# Roles of the CPU partition: Python control loops whose heavy work (verifiers, sandboxes) runs
# in subprocesses, so each rank gets one thread.
CPU_ROLES = ("reward", "env", "orchestrator")


class PlanError(ValueError):
    """A layout that cannot run; the message says why and what would."""


@dataclass(frozen=True)
class TrainerLayout:
    nodes: int
    world_size: int
    tensor_parallel: int
    pipeline_parallel: int
    context_parallel: int
    expert_parallel: int
    data_parallel: int


@dataclass(frozen=True)
class RolloutLayout:
    placement: str
    nodes: int  # nodes of their own (0 when colocated)
    num_engines: int
    engine_tensor_parallel: int


@dataclass(frozen=True)
class Component:
    """One heterogeneous-job component (one ``#SBATCH hetjob`` block, one ``--het-group``)."""

    name: str
    partition: str
    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    roles: tuple[str, ...]
    num_tasks: int = 0  # total tasks when not nodes x tasks_per_node (the CPU component's extra orchestrator)
    plane_block: int = 0  # srun --distribution=plane block size when uneven: blocks go to the nodes cyclically

    @property
    def total_tasks(self) -> int:
        return self.num_tasks or self.nodes * self.tasks_per_node


@dataclass(frozen=True)
class RankAssignment:
    world_rank: int
    role: str
    role_rank: int
    component: str
    node: int  # node index within the component
    gpus: tuple[int, ...] = ()  # local GPU ids this rank drives


@dataclass(frozen=True)
class Plan:
    nodes: int
    gpus_per_node: int
    trainer: TrainerLayout
    rollout: RolloutLayout
    num_reward_workers: int
    components: tuple[Component, ...]
    assignments: tuple[RankAssignment, ...] = field(repr=False)
    num_env_workers: int = 0  # env-server ranks (env.placement=role); 0: environments run inside the rollout ranks
    num_reward_servers: int = 0  # judge / reward-model replicas; 0: the rubric serves no model

    @property
    def world_size(self) -> int:
        return len(self.assignments)

    def ranks_of(self, role: str) -> list[int]:
        return [a.world_rank for a in self.assignments if a.role == role]

    def engines_on_gpu_of(self, world_rank: int) -> list[RankAssignment]:
        """The rollout engines that hold rank ``world_rank``'s (first) GPU: colocated on it."""
        rank = self.assignments[world_rank]
        return [
            a
            for a in self.assignments
            if a.role == "rollout"
            and rank.gpus
            and (a.component, a.node) == (rank.component, rank.node)
            and rank.gpus[0] in a.gpus
        ]

    def engines_share_gpu_of(self, world_rank: int) -> bool:
        """Whether every rollout engine can open CUDA IPC handles of rank ``world_rank``'s GPU memory.

        An engine must hold that GPU, at the same device index: a rollout rank sees only its
        engine's GPUs, and torch reopens a handle at the sender's device index.
        """
        on_it, engines = self.engines_on_gpu_of(world_rank), self.ranks_of("rollout")
        gpu = self.assignments[world_rank].gpus[0] if on_it else None
        return bool(engines) and len(on_it) == len(engines) and all(a.gpus.index(gpu) == gpu for a in on_it)

    def role_sizes(self) -> dict[str, int]:
        return {role: len(self.ranks_of(role)) for role in ROLES}

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Plan:
        raw = json.loads(text)
        return cls(
            nodes=raw["nodes"],
            gpus_per_node=raw["gpus_per_node"],
            trainer=TrainerLayout(**raw["trainer"]),
            rollout=RolloutLayout(**raw["rollout"]),
            num_reward_workers=raw["num_reward_workers"],
            num_env_workers=raw.get("num_env_workers", 0),
            num_reward_servers=raw.get("num_reward_servers", 0),
            components=tuple(Component(**{**c, "roles": tuple(c["roles"])}) for c in raw["components"]),
            assignments=tuple(RankAssignment(**{**a, "gpus": tuple(a["gpus"])}) for a in raw["assignments"]),
        )

    def save(self, run_dir: Path) -> Path:
        path = Path(run_dir) / rundir.PLAN
        path.write_text(self.to_json())
        return path


def make_plan(cfg: HetrlConfig) -> Plan:
    """Compute and validate the layout of every role for ``cfg.nodes`` nodes."""
    if cfg.cluster.gpus_per_node == 0:
        return _cpu_plan(cfg)
    return _gpu_plan(cfg)


def _cpu_plan(cfg: HetrlConfig) -> Plan:
    """This machine, no GPU: one local 'node'; DP only as wide as expert parallelism needs."""
    if cfg.nodes != 1:
        raise PlanError(
            f"nodes={cfg.nodes} with a CPU-only cluster profile (cluster.gpus_per_node=0): local runs use nodes=1"
        )
    if cfg.rollout.engine_tensor_parallel != 1:
        raise PlanError(
            f"rollout.engine_tensor_parallel={cfg.rollout.engine_tensor_parallel}: CPU engines run without TP; use 1"
        )
    t = cfg.trainer
    data_parallel = t.expert_parallel
    world = t.model_parallel_size * data_parallel
    trainer = _check_trainer(cfg, nodes=1, world=world)
    rollout = RolloutLayout(
        "colocated" if cfg.rollout.placement == "colocated" else "disaggregated", 0, cfg.rollout.num_engines or 1, 1
    )
    num_reward = max(1, cfg.cluster.cpu_nodes * cfg.cluster.reward_workers_per_node)
    num_env = max(1, cfg.cluster.cpu_nodes * env_workers_per_node(cfg)) if env_workers_per_node(cfg) else 0
    if cfg.reward.served_models and cfg.reward.server.tensor_parallel != 1:
        raise PlanError(
            f"reward.server.tensor_parallel={cfg.reward.server.tensor_parallel}: CPU reward servers run without TP; "
            f"use 1"
        )
    num_servers = cfg.reward.server.replicas if cfg.reward.served_models else 0
    role_counts = {
        "trainer": world,
        "rollout": rollout.num_engines,
        "reward_server": num_servers,
        "reward": num_reward,
        "env": num_env,
        "orchestrator": 1,
    }
    assignments, rank = [], 0
    for role in ROLES:
        for role_rank in range(role_counts[role]):
            assignments.append(RankAssignment(rank, role, role_rank, "local", 0))
            rank += 1
    component = Component("local", "local", 1, len(assignments), 0, tuple(role for role in ROLES if role_counts[role]))
    return Plan(1, 0, trainer, rollout, num_reward, (component,), tuple(assignments), num_env, num_servers)


def env_workers_per_node(cfg: HetrlConfig) -> int:
    """Env-server ranks per CPU node: ``cluster.env_workers_per_node`` under env.placement=role, else 0."""
    return cfg.cluster.env_workers_per_node if cfg.env.placement == "role" else 0


def _gpu_plan(cfg: HetrlConfig) -> Plan:
    gpn, nodes, r = cfg.cluster.gpus_per_node, cfg.nodes, cfg.rollout
    if gpn % r.engine_tensor_parallel:
        raise PlanError(
            f"rollout.engine_tensor_parallel={r.engine_tensor_parallel} does not divide the {gpn} GPUs of a node; "
            f"valid: {_divisors(gpn)}"
        )
    if r.placement == "colocated":
        trainer_nodes, engine_nodes = nodes, 0
    else:
        engine_nodes = r.engine_nodes if r.engine_nodes is not None else max(1, nodes // 2)
        trainer_nodes = nodes - engine_nodes
        if trainer_nodes < 1:
            raise PlanError(
                f"rollout.placement=disaggregated with nodes={nodes} and rollout.engine_nodes={engine_nodes} leaves "
                f"no trainer node; "
                + (f"use rollout.engine_nodes<={nodes - 1}, " if nodes > 1 else f"use nodes>={engine_nodes + 1}, ")
                + "or rollout.placement=colocated"
            )
    trainer = _check_trainer(cfg, nodes=trainer_nodes, world=trainer_nodes * gpn)
    nodes_with_engines = engine_nodes or trainer_nodes
    slots_per_node = gpn // r.engine_tensor_parallel
    num_engines = r.num_engines or nodes_with_engines * slots_per_node
    if num_engines % nodes_with_engines or num_engines > nodes_with_engines * slots_per_node:
        valid = [nodes_with_engines * k for k in range(1, slots_per_node + 1)]
        raise PlanError(
            f"rollout.num_engines={num_engines} cannot be spread evenly over {nodes_with_engines} engine nodes with "
            f"{slots_per_node} engine slots of TP {r.engine_tensor_parallel} each; valid: {valid}"
        )
    if cfg.cluster.cpu_nodes < 1:
        raise PlanError(
            "reward workers, env servers and the orchestrator run on the CPU partition: set cluster.cpu_nodes >= 1"
        )
    rollout = RolloutLayout(r.placement, engine_nodes, num_engines, r.engine_tensor_parallel)
    return _assemble_gpu(cfg, trainer, rollout, engines_per_node=num_engines // nodes_with_engines)


def _assemble_gpu(cfg: HetrlConfig, trainer: TrainerLayout, rollout: RolloutLayout, engines_per_node: int) -> Plan:
    """Lay ranks out node by node (srun's block order): a node's trainer ranks, then its engines."""
    gpn, tp_e = cfg.cluster.gpus_per_node, rollout.engine_tensor_parallel
    colocated = rollout.placement == "colocated"
    assignments: list[RankAssignment] = []
    counters = dict.fromkeys(ROLES, 0)

    def add(role: str, component: str, node: int, gpus: tuple[int, ...] = ()) -> None:
        assignments.append(RankAssignment(len(assignments), role, counters[role], component, node, gpus))
        counters[role] += 1

    def add_engines(component: str, node: int) -> None:
        for slot in range(engines_per_node):
            add("rollout", component, node, tuple(range(slot * tp_e, (slot + 1) * tp_e)))

    for node in range(trainer.nodes):
        for gpu in range(gpn):
            add("trainer", "train", node, (gpu,))
        if colocated:
            add_engines("train", node)
    train_tasks = gpn + (engines_per_node if colocated else 0)
    components = [
        Component(
            "train",
            cfg.cluster.gpu_partition,
            trainer.nodes,
            train_tasks,
            gpn,
            ("trainer", "rollout") if colocated else ("trainer",),
        )
    ]
    if not colocated:
        for node in range(rollout.nodes):
            add_engines("rollout", node)
        components.append(
            Component("rollout", cfg.cluster.gpu_partition, rollout.nodes, engines_per_node, gpn, ("rollout",))
        )
    if cfg.reward.served_models:
        components.append(_reward_server_component(cfg, add))
    # CPU partition: reward workers and env servers fill it; the (light) orchestrator is one extra task on its first
    # node.
    cpu_nodes, rewards, envs = cfg.cluster.cpu_nodes, cfg.cluster.reward_workers_per_node, env_workers_per_node(cfg)
    per_node = rewards + envs
    # srun lays the component out with --distribution=plane=per_node: a block of per_node tasks per
    # node, then the last task (the orchestrator) wraps around to node 0.
    for index, role in enumerate((["reward"] * rewards + ["env"] * envs) * cpu_nodes):
        add(role, "cpu", index // per_node)
    add("orchestrator", "cpu", 0)
    cpu_roles = ("orchestrator", "reward", "env") if envs else ("orchestrator", "reward")
    components.append(
        Component(
            "cpu",
            cfg.cluster.cpu_partition,
            cpu_nodes,
            per_node + 1,
            0,
            cpu_roles,
            cpu_nodes * per_node + 1,
            plane_block=per_node,
        )
    )
    return Plan(
        cfg.nodes,
        gpn,
        trainer,
        rollout,
        counters["reward"],
        tuple(components),
        tuple(assignments),
        counters["env"],
        counters["reward_server"],
    )


# noqa: ANN001 - _assemble_gpu's add(role, component, node, gpus)
def _reward_server_component(cfg: HetrlConfig, add) -> Component:
    """The judge / reward-model replicas: GPU nodes of their own, replicas filling each node's GPUs in turn."""
    server, gpn = cfg.reward.server, cfg.cluster.gpus_per_node
    if gpn % server.tensor_parallel:
        raise PlanError(
            f"reward.server.tensor_parallel={server.tensor_parallel} does not divide the {gpn} GPUs of a node; "
            f"valid: {_divisors(gpn)}"
        )
    per_node = gpn // server.tensor_parallel
    nodes = -(-server.replicas // per_node)
    if server.replicas % nodes:
        valid = list(range(1, per_node + 1)) + [per_node * k for k in range(2, 5)]
        raise PlanError(
            f"reward.server.replicas={server.replicas} cannot be spread evenly over {nodes} node(s) of {per_node} "
            f"replica(s) of TP {server.tensor_parallel}; valid: {valid}"
        )
    per_node = server.replicas // nodes
    for node in range(nodes):
        for slot in range(per_node):
            add(
                "reward_server",
                "reward_server",
                node,
                tuple(range(slot * server.tensor_parallel, (slot + 1) * server.tensor_parallel)),
            )
    return Component(
        "reward_server", server.partition or cfg.cluster.gpu_partition, nodes, per_node, gpn, ("reward_server",)
    )


def _check_trainer(cfg: HetrlConfig, nodes: int, world: int) -> TrainerLayout:
    t, m, gpn = cfg.trainer, cfg.model, cfg.cluster.gpus_per_node
    tp, pp, cp, ep = t.tensor_parallel, t.pipeline_parallel, t.context_parallel, t.expert_parallel
    checks = [
        ("num_attention_heads", m.num_attention_heads),
        ("num_query_groups", m.num_query_groups),
        ("ffn_hidden_size", m.ffn_hidden_size),
    ]
    for name, value in checks:
        if value % tp:
            valid = [d for d in _divisors(value) if not gpn or d <= gpn]
            raise PlanError(
                f"trainer.tensor_parallel={tp} does not divide model.{name}={value}; valid tensor_parallel values: "
                f"{valid[:8]}"
            )
    if gpn and tp > gpn:
        raise PlanError(
            f"trainer.tensor_parallel={tp} spans nodes ({gpn} GPUs per node); keep TP inside a node: tensor_parallel "
            f"<= {gpn}"
        )
    if m.num_layers % pp:
        raise PlanError(
            f"trainer.pipeline_parallel={pp} does not divide model.num_layers={m.num_layers}; valid: "
            f"{_divisors(m.num_layers)[:10]}"
        )
    if m.is_moe and m.num_experts % ep:
        raise PlanError(
            f"trainer.expert_parallel={ep} does not divide model.num_experts={m.num_experts}; valid: "
            f"{_divisors(m.num_experts)}"
        )
    model_parallel = tp * pp * cp
    if world % model_parallel:
        raise PlanError(
            f"{world} trainer GPUs are not divisible by TP x PP x CP = {tp} x {pp} x {cp} = {model_parallel}"
            + _nearby_nodes_hint(cfg, lambda w: w % model_parallel == 0 and w % (tp * pp * ep) == 0)
        )
    if world % (tp * pp * ep):
        raise PlanError(
            f"{world} trainer GPUs are not divisible by TP x PP x EP = {tp} x {pp} x {ep} = {tp * pp * ep} "
            f"(expert-parallel groups)"
            + _nearby_nodes_hint(cfg, lambda w: w % model_parallel == 0 and w % (tp * pp * ep) == 0)
        )
    dp = world // model_parallel
    # Every data-parallel rank needs a sample of every minibatch (trainer/shards.py shard_indices).
    minibatch = cfg.run.prompts_per_step * cfg.algorithm.group_size // t.updates_per_batch
    if minibatch < dp:
        raise PlanError(
            f"each minibatch of {minibatch} samples (run.prompts_per_step x algorithm.group_size / "
            f"trainer.updates_per_batch) "
            f"cannot feed the trainer's {dp} data-parallel ranks: raise run.prompts_per_step or lower "
            f"trainer.updates_per_batch"
        )
    if t.shared_prompts and cfg.run.prompts_per_step // t.updates_per_batch < dp:
        raise PlanError(
            f"trainer.shared_prompts keeps a group's samples on one data-parallel rank: each minibatch's "
            f"{cfg.run.prompts_per_step // t.updates_per_batch} groups cannot feed {dp} ranks; raise "
            f"run.prompts_per_step"
        )
    if cfg.warm_start.steps and cfg.warm_start.batch_size < dp:
        raise PlanError(
            f"warm_start.batch_size={cfg.warm_start.batch_size} cannot feed the trainer's {dp} data-parallel ranks: "
            f"use warm_start.batch_size >= {dp}"
        )
    return TrainerLayout(nodes, world, tp, pp, cp, ep, dp)


def _nearby_nodes_hint(cfg: HetrlConfig, fits) -> str:
    gpn = cfg.cluster.gpus_per_node
    if not gpn:
        return ""
    engine_nodes = 0 if cfg.rollout.placement == "colocated" else (cfg.rollout.engine_nodes or cfg.nodes // 2)
    candidates = [n for n in range(1, 4 * cfg.nodes + 8) if n > engine_nodes and fits((n - engine_nodes) * gpn)]
    nearest = sorted(candidates, key=lambda n: (abs(n - cfg.nodes), n))[:3]
    return f"; nearby node counts that fit: {sorted(nearest)}" if nearest else ""


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
