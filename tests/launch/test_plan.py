"""Placement planner: layouts at 1, 8, 128 and 1024 nodes, and every impossible-layout error."""

import pytest

from hetrl.config import load_config
from hetrl.control.plan import Plan, PlanError, make_plan


def plan_of(recipe, *overrides):
    return make_plan(load_config(recipe, list(overrides)))


def check_consistent(plan: Plan):
    """Invariants every plan keeps: ranks dense and in component order, GPUs within a node."""
    assert [a.world_rank for a in plan.assignments] == list(range(plan.world_size))
    assert sum(c.total_tasks for c in plan.components) == plan.world_size
    order = [c.name for c in plan.components]
    assert [order.index(a.component) for a in plan.assignments] == sorted(
        order.index(a.component) for a in plan.assignments
    )
    for role, n in plan.role_sizes().items():
        assert sorted(a.role_rank for a in plan.assignments if a.role == role) == list(range(n))
    for a in plan.assignments:
        assert all(0 <= g < max(plan.gpus_per_node, 1) for g in a.gpus)
    t = plan.trainer
    assert t.world_size == t.tensor_parallel * t.pipeline_parallel * t.context_parallel * t.data_parallel
    assert plan.role_sizes()["trainer"] == t.world_size


def test_tiny_grpo_local_plan():
    plan = plan_of("tiny_grpo")
    check_consistent(plan)
    assert plan.role_sizes() == {
        "trainer": 1,
        "rollout": 1,
        "reward_server": 0,
        "reward": 1,
        "env": 0,
        "orchestrator": 1,
    }
    assert [c.name for c in plan.components] == ["local"]


@pytest.mark.parametrize("recipe", ["tiny_judge_grpo", "tiny_rm_grpo"])
def test_a_served_reward_model_gets_its_own_local_rank(recipe):
    plan = plan_of(recipe, "reward.server.replicas=2")
    check_consistent(plan)
    assert plan.role_sizes()["reward_server"] == 2 and plan.num_reward_servers == 2
    assert Plan.from_json(plan.to_json()) == plan


def test_a_judge_pool_is_a_gpu_component_of_its_own_at_scale():
    judge = [
        "reward.functions=[{name: judge}]",
        "reward.judge.model=/models/judge",
        "reward.server.replicas=8",
        "reward.server.tensor_parallel=4",
        "reward.server.partition=judge",
    ]
    plan = plan_of("moe_grpo", "nodes=128", *judge)
    check_consistent(plan)
    [pool] = [c for c in plan.components if c.name == "reward_server"]
    assert (pool.partition, pool.nodes, pool.tasks_per_node, pool.gpus_per_node) == ("judge", 4, 2, 8)
    servers = [a for a in plan.assignments if a.role == "reward_server"]
    assert [a.gpus for a in servers[:2]] == [(0, 1, 2, 3), (4, 5, 6, 7)] and {a.node for a in servers} == {0, 1, 2, 3}
    with pytest.raises(PlanError, match="reward.server.replicas=3 cannot be spread evenly"):
        plan_of("moe_grpo", "nodes=128", *judge[:2], "reward.server.replicas=3", "reward.server.tensor_parallel=4")


def test_cpu_expert_parallel_gets_two_trainer_ranks():
    plan = plan_of("tiny_grpo", "model=tiny_qwen3_moe", "trainer.expert_parallel=2")
    check_consistent(plan)
    assert plan.trainer.data_parallel == 2 and plan.role_sizes()["trainer"] == 2


@pytest.mark.parametrize("nodes", [1, 8, 128, 1024])
def test_moe_colocated_at_scale(nodes):
    # One node holds 8 GPUs: TP 2 x EP 4 there; from 8 nodes on, the recipe's TP 2 x PP 4 x EP 8.
    small = ["trainer.pipeline_parallel=1", "trainer.expert_parallel=4"] if nodes == 1 else []
    plan = plan_of("moe_grpo", f"nodes={nodes}", *small)
    check_consistent(plan)
    t = plan.trainer
    assert t.world_size == nodes * 8 and t.expert_parallel == (4 if nodes == 1 else 8)
    assert plan.rollout.num_engines == nodes * 2  # TP-4 engines tile the 8 GPUs of every node
    train = plan.components[0]
    assert (train.name, train.nodes, train.tasks_per_node, train.gpus_per_node) == ("train", nodes, 10, 8)
    # On each node: 8 trainer ranks on GPUs 0..7, then two engines on GPUs 0-3 and 4-7.
    node0 = [a for a in plan.assignments if a.component == "train" and a.node == 0]
    assert [a.role for a in node0] == ["trainer"] * 8 + ["rollout"] * 2
    assert [a.gpus for a in node0[8:]] == [(0, 1, 2, 3), (4, 5, 6, 7)]


@pytest.mark.parametrize("nodes", [8, 128, 1024])
def test_dense_disaggregated_split(nodes):
    # A step must give every data-parallel rank samples: the batch grows with the cluster.
    plan = plan_of(
        "dense_grpo",
        f"nodes={nodes}",
        f"rollout.engine_nodes={nodes // 4}",
        f"run.prompts_per_step={max(128, 2 * nodes)}",
    )
    check_consistent(plan)
    assert plan.trainer.nodes == nodes - nodes // 4 and plan.rollout.nodes == nodes // 4
    assert plan.trainer.data_parallel == plan.trainer.world_size // 4
    names = [c.name for c in plan.components]
    assert names == ["train", "rollout", "cpu"]
    rollout = plan.components[1]
    assert rollout.tasks_per_node == 4 and plan.rollout.num_engines == 4 * (nodes // 4)
    cpu = plan.components[2]
    assert cpu.partition == "cpu" and plan.role_sizes()["orchestrator"] == 1


def test_planning_1024_nodes_is_fast_enough_to_be_interactive():
    plan = plan_of("moe_grpo", "nodes=1024")
    assert plan.world_size == 1024 * 10 + 65


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["trainer.tensor_parallel=3"],
            r"tensor_parallel=3 does not divide model.num_attention_heads=32; valid tensor_parallel values: \[1, 2, "
            r"4, 8\]",
        ),
        (
            ["trainer.tensor_parallel=16", "trainer.pipeline_parallel=1", "trainer.expert_parallel=1"],
            "does not divide model.num_query_groups|spans nodes",
        ),
        (["trainer.pipeline_parallel=5"], r"pipeline_parallel=5 does not divide model.num_layers=48; valid"),
        (["trainer.expert_parallel=3"], r"expert_parallel=3 does not divide model.num_experts=128"),
        (
            ["nodes=3", "trainer.pipeline_parallel=1", "trainer.expert_parallel=16"],
            r"not divisible by TP x PP x EP.*nearby node counts that fit: \[4, 8, 12\]",
        ),
        (["rollout.engine_tensor_parallel=3"], r"engine_tensor_parallel=3 does not divide the 8 GPUs"),
        (["rollout.num_engines=33"], r"num_engines=33 cannot be spread evenly over 16 engine nodes.*valid: \[16, 32\]"),
        (["cluster.cpu_nodes=0"], r"cluster.cpu_nodes >= 1"),
    ],
)
def test_impossible_layouts_say_why_and_suggest(overrides, message):
    with pytest.raises(PlanError, match=message):
        plan_of("moe_grpo", *overrides)


def test_disaggregated_without_trainer_nodes():
    with pytest.raises(PlanError, match=r"leaves no trainer node; use nodes>=5"):
        plan_of("dense_grpo", "nodes=1")
    with pytest.raises(PlanError, match=r"use rollout.engine_nodes<=7"):
        plan_of("dense_grpo", "nodes=8", "rollout.engine_nodes=8")


def test_cpu_profile_errors():
    with pytest.raises(PlanError, match="local runs use nodes=1"):
        plan_of("tiny_grpo", "nodes=2")
    with pytest.raises(PlanError, match="CPU engines run without TP"):
        plan_of("tiny_grpo", "rollout.engine_tensor_parallel=2")


def test_plan_json_round_trip(tmp_path):
    plan = plan_of("dense_grpo")
    plan.save(tmp_path)
    assert Plan.from_json((tmp_path / "plan.json").read_text()) == plan


def test_ipc_reach_needs_every_engine_on_trainer_rank_0s_gpu():
    """CUDA IPC from trainer rank 0 reaches an engine only where that engine sees rank 0's GPU."""
    one_engine = plan_of(
        "moe_grpo",
        "nodes=1",
        "trainer.pipeline_parallel=1",
        "trainer.expert_parallel=4",
        "rollout.engine_tensor_parallel=8",
    )
    assert one_engine.rollout.num_engines == 1 and one_engine.engines_share_gpu_of(0)
    two_engines = plan_of("moe_grpo", "nodes=1", "trainer.pipeline_parallel=1", "trainer.expert_parallel=4")
    assert not two_engines.engines_share_gpu_of(0)  # the engine on GPUs 4-7 cannot open rank 0's handles
    # ... and the one on GPUs 0-3 shares rank 0's GPU: it must receive NCCL pushes on another GPU
    assert [a.gpus for a in two_engines.engines_on_gpu_of(0)] == [(0, 1, 2, 3)]
    disaggregated = plan_of("dense_grpo", "nodes=8", "rollout.engine_nodes=2")
    assert not disaggregated.engines_share_gpu_of(0) and disaggregated.engines_on_gpu_of(0) == []
    assert not plan_of("tiny_grpo").engines_share_gpu_of(0)  # CPU: no GPUs at all


def test_cpu_ranks_sit_where_srun_plane_distribution_puts_them():
    plan = plan_of("dense_grpo", "nodes=8", "rollout.engine_nodes=2", "cluster.cpu_nodes=3")
    cpu = plan.components[-1]
    ranks = [a for a in plan.assignments if a.component == "cpu"]
    # Blocks of plane_block tasks per node, cyclically: the extra (orchestrator) task wraps to node 0.
    assert [a.node for a in ranks] == [(i // cpu.plane_block) % cpu.nodes for i in range(len(ranks))]
    per_node = [sum(a.node == n for a in ranks) for n in range(cpu.nodes)]
    assert per_node == [cpu.plane_block + 1] + [cpu.plane_block] * (
        cpu.nodes - 1
    )  # even, node 0 holds the orchestrator
    assert ranks[-1].role == "orchestrator" and ranks[-1].node == 0
