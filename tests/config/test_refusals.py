"""Combinations that cannot run are refused on the login node, by the checks every launch and dry run
makes (hetrl.launch.cli.compose_and_plan), with a message naming the keys and the way out."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hetrl.config.loader import ConfigError, available_recipes
from hetrl.control.plan import PlanError
from hetrl.env.registry import build_held_out_split
from hetrl.launch.cli import compose_and_plan
from hetrl.loop.driver import reward_line

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "recipe, overrides, message",
    [
        # the planner's shape checks (megatron's asserts in trainer/model.py build_gpt_model)
        ("moe_grpo", ["trainer.pipeline_parallel=5"], "pipeline_parallel=5 does not divide model.num_layers=48"),
        ("moe_grpo", ["trainer.expert_parallel=3"], "expert_parallel=3 does not divide model.num_experts=128"),
        ("moe_grpo", ["trainer.tensor_parallel=3"], "tensor_parallel=3 does not divide model.num_attention_heads=32"),
        (
            "moe_grpo",
            ["model.moe_ffn_hidden_size=769"],
            r"tensor_parallel=2 does not divide model.moe_ffn_hidden_size=769.*valid tensor_parallel values: \[1\]",
        ),
        (
            "moe_grpo",
            ["trainer.sequence_parallel=false"],
            "tensor_parallel=2 with an MoE model needs trainer.sequence_parallel=true",
        ),
        (
            "moe_grpo",
            ["nodes=128", "trainer.updates_per_batch=32"],
            "each minibatch of 64 samples .* cannot feed the trainer's 128 data-parallel ranks",
        ),
        (
            "moe_grpo",
            ["nodes=128", "warm_start.steps=1", "warm_start.batch_size=64"],
            "warm_start.batch_size=64 cannot feed the trainer's 128 data-parallel ranks",
        ),
        ("moe_grpo", ["model.moe_router_topk=1"], "moe_router_topk=1: .*use moe_router_topk >= 2"),
        (
            "tiny_grpo",
            ["model.vocab_size=64"],
            "model.vocab_size=64 is smaller than the built-in character tokenizer.*>= 101",
        ),
        (
            "tiny_vlm_grpo",
            ["model.vocab_size=101"],
            r"model.vocab_size=101 is smaller .*>= 102 \(its <image> token included\)",
        ),
        # images need a vision-language policy; the image ablation needs scenes drawn from tasks
        (
            "tiny_grpo",
            [
                "env.name=multimodal",
                "env.tasks.source=shapes",
                "env.tasks.options={}",
                "env.tasks.answer_instruction=null",
            ],
            "env.name=multimodal shows the policy images, but model.arch=llama is a text model",
        ),
        ("tiny_grpo", ["eval.image_ablation=true"], "eval.image_ablation=true .* only env.name=multimodal"),
        (
            "tiny_computer_use",
            ["trainer.pack_length=1800"],
            r"pack_length=1800 is shorter than the longest episode .* \(1860 positions",
        ),
        (
            "tiny_vlm_grpo",
            ["trainer.context_parallel=2"],
            "vision-language policy .* without context or sequence parallelism",
        ),
        (
            "tiny_vlm_grpo",
            ["trainer.tensor_parallel=4"],
            r"tensor_parallel=4 does not divide model.vision.num_attention_heads=2",
        ),
        # what CPU-only profiles cannot do (transformer-engine, CUDA IPC); bf16 and sequence parallelism they can, so
        # MoE under TP needs SP there as on GPUs (megatron's MoELayer)
        (
            "tiny_grpo",
            ["trainer.transformer_impl=transformer_engine"],
            "transformer_impl=transformer_engine on a CPU-only.*use auto or local",
        ),
        (
            "tiny_grpo",
            ["model=tiny_qwen3_moe", "trainer.tensor_parallel=2"],
            "tensor_parallel=2 with an MoE model needs trainer.sequence_parallel=true",
        ),
        ("tiny_grpo", ["rollout.weight_sync=ipc"], "weight_sync=ipc on a CPU-only.*use auto, collective or filesystem"),
        (
            "dense_grpo",
            ["rollout.weight_sync=ipc"],
            "weight_sync=ipc needs the job's only engine colocated.*placement=disaggregated",
        ),
        # engines (vLLM refuses a context beyond the checkpoint's; rollout/engine.py core lists)
        (
            "tiny_grpo",
            ["rollout.max_model_len=1024"],
            "rollout.max_model_len=1024 exceeds model.max_position_embeddings=256",
        ),
        # routing replay (trainer/routing_replay.py)
        ("tiny_grpo", ["rollout.routing_replay=true"], "routing_replay=true needs an MoE model.*model.arch=llama"),
        ("tiny_grpo", ["rollout.return_routing=true"], "return_routing=true needs an MoE model"),
        (
            "tiny_moe_grpo",
            ["trainer.pipeline_parallel=2", "trainer.recompute_activations=true"],
            "recompute_activations=true needs trainer.pipeline_parallel=1",
        ),
        (
            "tiny_grpo",
            ["rollout.cpu_threads_bind=0-1|2-3"],
            r"cpu_threads_bind='0-1\|2-3' names 2 core list\(s\) for rollout.engine_tensor_parallel=1",
        ),
        # algorithm and stages
        ("tiny_grpo", ["algorithm.lam=1.0"], "algorithm.lam set, but only algorithm.name=ppo .* reads them"),
        (
            "tiny_grpo",
            ["algorithm.kl_in_reward=true"],
            "kl_in_reward=true .* algorithm.kl_coef=0 leaves nothing to fold.*set algorithm.kl_coef > 0",
        ),
        (
            "tiny_grpo",
            ["critic.lr=0.001"],
            r"critic.lr set, but algorithm.name='grpo' has no value model.*use algorithm.name=ppo",
        ),
        (
            "dense_grpo",
            ["critic.init=fresh", "critic.lr=0.001"],
            "critic.init, critic.lr set, but algorithm.name='grpo'",
        ),
        ("tiny_grpo", ["trainer.min_lr=0.001"], "trainer.min_lr=0.001 exceeds trainer.lr=0.0005"),
        (
            "tiny_grpo",
            ["warm_start.lr=1.0e-4", "trainer.min_lr=2.0e-4"],
            "trainer.min_lr=0.0002 exceeds warm_start.lr=0.0001",
        ),
        (
            "tiny_grpo",
            ["warm_start.template='{answer} {score}'"],
            r"warm_start.template=.* is not a format string over \{answer\} alone",
        ),
        # a step's batch and lengths (trainer/shards.py minibatch_bounds, trainer/batch.py packing)
        (
            "tiny_grpo",
            ["trainer.updates_per_batch=129"],
            r"updates_per_batch=129 .* 16 x 8 = 128 samples.*updates_per_batch <= 128",
        ),
        ("tiny_ppo", ["run.prompts_per_step=2", "trainer.updates_per_batch=17"], "updates_per_batch <= 16"),
        (
            "tiny_grpo",
            ["trainer.pack_length=64"],
            r"pack_length=64 is shorter than the longest episode the trainer may get \(160 positions: "
            r"env.max_episode_tokens",
        ),
        # shared-prompt rows (trainer/shared_prompts.py): hetrl's attention, whole rows on every rank, text only
        (
            "tiny_grpo",
            ["trainer.pack_length=256"],
            r"shared_prompts=true does not run with trainer.pack_length: set trainer.shared_prompts=false",
        ),
        (
            "tiny_grpo",
            ["trainer.tensor_parallel=2", "trainer.sequence_parallel=true"],
            r"shared_prompts=true does not run with trainer.sequence_parallel",
        ),
        (
            "tiny_grpo",
            ["trainer.context_parallel=2"],
            r"shared_prompts=true does not run with trainer.context_parallel > 1",
        ),
        (
            "dense_grpo",
            ["trainer.shared_prompts=true", "nodes=64", "run.prompts_per_step=64", "algorithm.group_size=16"],
            r"keeps a group's samples on one data-parallel rank: each minibatch's 64 groups cannot feed 120 ranks",
        ),
        # environments and task sources (hetrl.env.registry)
        (
            "tiny_grpo",
            ["env.name=maths"],
            r"unknown environment 'maths' \(did you mean 'math'\?\); valid names: code, math",
        ),
        (
            "tiny_grpo",
            ["env.tasks.source=reasoninggym"],
            r"unknown task source 'reasoninggym' \(did you mean 'reasoning_gym'\?\)",
        ),
        ("tiny_tool_grpo", ["env.tasks.source=file"], r"env.tasks: path is required when source is 'file'"),
        # the held-out split (hetrl.env.tasks.split): 64 of 1-digit sums' 121 distinct questions cannot be carved out
        (
            "tiny_grpo",
            ["eval.num_tasks=64"],
            r"eval: 64 of the 64 eval tasks \(eval.num_tasks\) also appear in training, and 64 of its 121 distinct .*"
            r"at most 30.*eval.num_tasks <= 30.*set eval.allow_training_overlap=true to report a training-set reward",
        ),
        (
            "tiny_grpo",
            ["env.tasks.source=human_eval"],
            r"env.tasks: options is not used by task source 'human_eval'.*set it to \{\}",
        ),
        # files named by the recipe (hetrl.config.paths)
        (
            "tiny_ppo",
            ["critic.init={tmp}/no_such_dir"],
            "critic.init='.*no_such_dir' is neither 'policy' nor 'fresh' nor an existing path",
        ),
        ("tiny_ppo", ["critic.init={tmp}"], "critic.init='.*' has no config.json and no \\*.safetensors"),
        ("tiny_grpo", ["model.hf_checkpoint={tmp}/missing"], "model.hf_checkpoint='.*missing' is not a directory"),
        (
            "tiny_grpo",
            [
                "env.tasks.source=file",
                "env.tasks.path={tmp}/tasks.jsonl",
                "env.tasks.options={}",
                "env.tasks.answer_instruction=null",
            ],
            "env.tasks.path='.*tasks.jsonl' is not a file",
        ),
        ("tiny_judge_grpo", ["reward.judge.model={tmp}/judge"], "reward.judge.model='.*judge' is not a directory"),
        ("tiny_rm_grpo", ["reward.reward_model.path={tmp}"], "reward.reward_model.path='.*' has no config.json"),
        # served reward models (hetrl.loop.reward_server_role, hetrl.reward.serving)
        ("tiny_grpo", ["reward.functions=[{name: judge}]"], "names judge but reward.judge.model is null"),
        (
            "tiny_grpo",
            ["reward.functions=[{name: reward_model}]"],
            "names reward_model but reward.reward_model.path is null",
        ),
        (
            "tiny_judge_grpo",
            ["reward.judge.template='{prompt} {response}'"],
            r"template must contain \{response\} and \{nonce\}",
        ),
        (
            "tiny_judge_grpo",
            ["reward.judge.template='{response} {nonce} {score}'"],
            "reward.judge.template does not format",
        ),
        ("tiny_judge_grpo", ["reward.server.tensor_parallel=2"], "CPU reward servers run without TP"),
        (
            "tiny_judge_grpo",
            ["reward.server.request_timeout_s=120"],
            "request_timeout_s=120 must be shorter than monitor.hang_timeout_s=120",
        ),
        (
            "tiny_grpo",
            ["monitor.start_timeout_s=60"],
            "monitor.start_timeout_s=60 must be at least monitor.hang_timeout_s=120",
        ),
        (
            "moe_grpo",
            ["reward.functions=[{name: judge}]", "reward.judge.model=policy", "reward.server.tensor_parallel=3"],
            r"reward.server.tensor_parallel=3 does not divide the 8 GPUs",
        ),
    ],
)
def test_refused_on_the_login_node(recipe, overrides, message, tmp_path):
    with pytest.raises((ConfigError, PlanError)) as err:
        compose_and_plan(recipe, [o.replace("{tmp}", str(tmp_path)) for o in overrides])
    assert re.search(message, str(err.value)), str(err.value)


@pytest.mark.parametrize("recipe", available_recipes())
def test_every_shipped_recipe_holds_its_eval_tasks_out_of_training(recipe):
    cfg, _ = compose_and_plan(recipe, [])  # refused when they overlap (check_held_out)
    assert not cfg.eval.allow_training_overlap


def test_a_recipe_that_accepts_training_overlap_reports_a_training_set_reward():
    cfg, _ = compose_and_plan("tiny_grpo", ["eval.num_tasks=64", "eval.allow_training_overlap=true"])
    report = build_held_out_split(cfg.env, seed=cfg.run.seed, num_eval_tasks=cfg.eval.num_tasks).report
    assert report.reward_kind == "training-set" and report.as_dict()["reward_kind"] == "training-set"
    assert report.summary().endswith(
        "64 of 64 eval tasks (100%) also appear in training: the eval reward is a training-set reward"
    )
    summary = {"eval_before": 0.0, "eval_after_warm_start": 0.25, "eval_after": 0.375}
    assert reward_line(cfg, summary, report.reward_kind) == (
        "[hetrl] training-set mean reward (64 tasks, mean@16, temperature 1): before 0.000, after warm start 0.250, "
        "after 25 RL steps 0.375"
    )
    held_out = build_held_out_split(cfg.env, seed=cfg.run.seed, num_eval_tasks=30).report.reward_kind
    assert reward_line(cfg, summary, held_out).startswith("[hetrl] held-out mean reward")


def test_an_hf_checkpoint_directory_is_accepted_as_critic_init(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    cfg, _ = compose_and_plan("tiny_ppo", [f"critic.init={tmp_path}", f"model.hf_checkpoint={tmp_path}"])
    assert cfg.critic.init == str(tmp_path)


@pytest.mark.parametrize("algorithm", sorted(p.stem for p in (ROOT / "recipes" / "algorithm").glob("*.yaml")))
def test_every_algorithm_group_plans_on_a_cluster_recipe(algorithm):
    cfg, _ = compose_and_plan("dense_grpo", [f"algorithm={algorithm}"])
    assert cfg.algorithm.name == algorithm


@pytest.mark.parametrize("choice", ["algorithm.name=ppo", "algorithm=ppo"])
def test_ppo_at_scale_dry_run(choice, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "launch.py"),
            "recipe=moe_grpo",
            "nodes=128",
            choice,
            f"run.output_dir={tmp_path}",
            "--dry-run",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "hetrl plan: moe_grpo on slurm_h100, 128 GPU node(s)" in proc.stdout
        and "TP 2 x PP 4 x CP 1 x DP 128 (EP 8)" in proc.stdout
    )
    resolved = yaml.safe_load((tmp_path / "moe_grpo" / "config.yaml").read_text())
    assert resolved["algorithm"]["name"] == "ppo" and resolved["critic"]["init"] == "policy"


def test_environment_and_task_source_names_match_the_registry():
    from hetrl.config.env import ENVIRONMENT_NAMES, TASK_SOURCE_NAMES
    from hetrl.env.registry import ENVIRONMENTS, TASK_SOURCES

    assert ENVIRONMENT_NAMES == tuple(sorted(ENVIRONMENTS)) and TASK_SOURCE_NAMES == tuple(sorted(TASK_SOURCES))


def test_an_openenv_recipe_without_the_extra_is_refused_by_a_dry_run(tmp_path):
    """launch.py --dry-run in a Python where openenv cannot be imported (sys.modules[name] = None is how
    the import system spells "not installed" to find_spec)."""
    launch = (
        "import runpy, sys; sys.modules['openenv'] = None; "
        f"sys.argv = ['launch.py', 'recipe=tiny_openenv_grpo', 'run.output_dir={tmp_path}', '--dry-run']; "
        f"runpy.run_path({str(ROOT / 'launch.py')!r}, run_name='__main__')"
    )
    proc = subprocess.run([sys.executable, "-c", launch], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and not (tmp_path / "tiny_openenv_grpo").exists()
    assert "env.name=openenv needs the openenv extra" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "pip install -e '.[openenv]'" in proc.stdout + proc.stderr
