"""env.placement=role: the planner puts env-server ranks on the CPU partition, and every view shows them."""

import json

from test_plan import check_consistent, plan_of

from hetrl.config import load_config
from hetrl.control.plan import Plan, make_plan
from hetrl.launch import cli
from hetrl.launch.local import mpiexec_command, threads_per_role
from hetrl.launch.sbatch import render_sbatch

ROLE = ["env.placement=role"]


def test_inline_environments_add_no_ranks():
    plan = plan_of("tiny_tool_grpo", "cluster.env_workers_per_node=3")
    assert plan.role_sizes()["env"] == 0 and plan.num_env_workers == 0
    assert "env" not in plan.components[0].roles


def test_local_plan_places_env_ranks_as_light_cpu_ranks(tmp_path):
    cfg = load_config("tiny_tool_grpo", [*ROLE, "cluster.env_workers_per_node=2"])
    plan = make_plan(cfg)
    check_consistent(plan)
    assert plan.role_sizes() == {
        "trainer": 1,
        "rollout": 1,
        "reward_server": 0,
        "reward": 1,
        "env": 2,
        "orchestrator": 1,
    }
    assert plan.num_env_workers == 2 and "env" in plan.components[0].roles
    inline = load_config("tiny_tool_grpo")
    assert threads_per_role(cfg, plan)["env"] == 1  # env ranks do not take cores from trainer and engine
    assert threads_per_role(cfg, plan)["trainer"] == threads_per_role(inline, make_plan(inline))["trainer"]
    command = " ".join(mpiexec_command(cfg, plan, tmp_path))
    assert "-n 2 -env OMP_NUM_THREADS 1 -env HETRL_THREADS 1 -env HETRL_ROLE env " in command


def test_cluster_plan_puts_env_ranks_beside_the_reward_workers_on_every_cpu_node():
    plan = plan_of(
        "dense_grpo",
        "nodes=8",
        *ROLE,
        "cluster.cpu_nodes=2",
        "cluster.reward_workers_per_node=2",
        "cluster.env_workers_per_node=3",
    )
    check_consistent(plan)
    cpu = plan.components[-1]
    assert (cpu.name, cpu.partition, cpu.nodes, cpu.tasks_per_node, cpu.total_tasks) == ("cpu", "cpu", 2, 6, 11)
    assert cpu.roles == ("orchestrator", "reward", "env")
    on_cpu = [a for a in plan.assignments if a.component == "cpu"]
    assert [(a.node, a.role) for a in on_cpu] == (
        [(0, "reward")] * 2 + [(0, "env")] * 3 + [(1, "reward")] * 2 + [(1, "env")] * 3 + [(0, "orchestrator")]
    )
    assert [a.role_rank for a in on_cpu if a.role == "env"] == list(range(6))
    assert all(a.gpus == () for a in on_cpu) and plan.num_env_workers == 6


def test_sbatch_script_and_dry_run_show_the_env_ranks(tmp_path, capsys):
    overrides = ["nodes=8", *ROLE, "cluster.env_workers_per_node=3"]
    plan = plan_of("dense_grpo", *overrides)
    script = render_sbatch(plan, load_config("dense_grpo", overrides).cluster, "/runs/x")
    # dense_grpo's cluster: 2 CPU nodes x (32 reward workers + 3 env servers), plus the orchestrator.
    assert "# component `cpu`: orchestrator, reward, env; 2 node(s), 71 task(s)" in script
    assert "#SBATCH --ntasks-per-node=36" in script and "--ntasks=71 --distribution=plane=35" in script
    assert cli.main(["recipe=dense_grpo", *overrides, f"run.output_dir={tmp_path}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "env servers on 'cpu'" in out and "orchestrator, reward, env" in script
    saved = Plan.from_json((tmp_path / "dense_grpo" / "plan.json").read_text())
    assert saved == plan and saved.ranks_of("env") == plan.ranks_of("env")


def test_plan_json_without_env_workers_still_loads():
    raw = json.loads(plan_of("tiny_grpo").to_json())
    del raw["num_env_workers"]
    assert Plan.from_json(json.dumps(raw)).num_env_workers == 0
