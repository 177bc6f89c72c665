"""Human-readable views of a plan (the ``--dry-run`` output)."""

from __future__ import annotations

from rich.table import Table

from hetrl.config.schema import HetrlConfig
from hetrl.control.plan import Plan


def plan_tables(cfg: HetrlConfig, plan: Plan) -> list[Table]:
    """Two tables: the job's components (what Slurm allocates) and the parallel layout of each role."""
    servers = sum(c.nodes for c in plan.components if c.name == "reward_server")
    extra = f" + {servers} reward-server node(s)" if servers else ""
    components = Table(
        title=f"hetrl plan: {cfg.recipe} on {cfg.cluster.name}, {plan.nodes} GPU node(s){extra}, {plan.world_size} "
        f"ranks"
    )
    for column in ("component", "partition", "nodes", "tasks", "tasks/node", "GPUs/node", "roles"):
        components.add_column(column)
    for c in plan.components:
        components.add_row(
            c.name,
            c.partition,
            str(c.nodes),
            str(c.total_tasks),
            str(c.tasks_per_node),
            str(c.gpus_per_node),
            ", ".join(c.roles),
        )

    t, r = plan.trainer, plan.rollout
    layout = Table(title="roles")
    for column in ("role", "ranks", "layout"):
        layout.add_column(column)
    sizes = plan.role_sizes()
    layout.add_row(
        "trainer",
        str(sizes["trainer"]),
        f"TP {t.tensor_parallel} x PP {t.pipeline_parallel} x CP {t.context_parallel} x DP {t.data_parallel}"
        f" (EP {t.expert_parallel}) on {t.nodes} node(s)",
    )
    where = (
        "colocated on the trainer GPUs, asleep through each train step"
        if r.placement == "colocated"
        else f"on {r.nodes} node(s) of their own"
    )
    layout.add_row(
        "rollout", str(sizes["rollout"]), f"{r.num_engines} vLLM engine(s), TP {r.engine_tensor_parallel}, {where}"
    )
    if plan.num_reward_servers:
        server = cfg.reward.server
        where = (
            f"TP {server.tensor_parallel} on {server.partition or cfg.cluster.gpu_partition!r}"
            if plan.gpus_per_node
            else "local"
        )
        layout.add_row(
            "reward_server",
            str(plan.num_reward_servers),
            f"frozen {' + '.join(cfg.reward.served_models)} replica(s), {where}, "
            "serving every reward worker over the control plane",
        )
    layout.add_row("reward", str(sizes["reward"]), f"reward/verifier/sandbox workers on {cfg.cluster.cpu_partition!r}")
    if sizes["env"]:
        layout.add_row(
            "env",
            str(sizes["env"]),
            f"env servers on {cfg.cluster.cpu_partition!r}: episodes' reset/step/close and tools, "
            "driven by the rollout ranks over the control plane",
        )
    layout.add_row("orchestrator", str(sizes["orchestrator"]), "data stream, batching, schedule")
    return [components, layout]
