"""Recipe composition, overrides and every error path of the config loader."""

from pathlib import Path

import pytest
import yaml

from hetrl.config import ConfigError, load_config, save_resolved
from hetrl.config.loader import available_recipes, validate_tree

SHIPPED = ["tiny_grpo", "dense_grpo", "moe_grpo"]


@pytest.mark.parametrize("recipe", SHIPPED)
def test_shipped_recipes_compose(recipe):
    cfg = load_config(recipe)
    assert cfg.recipe == recipe
    assert cfg.cluster.name  # every recipe pulls in a cluster profile


def test_every_recipe_file_loads():
    assert set(SHIPPED) <= set(available_recipes())
    for recipe in available_recipes():
        load_config(recipe)


def test_defaults_compose_groups_and_body_wins():
    cfg = load_config("moe_grpo")
    assert cfg.model.arch == "qwen3_moe" and cfg.model.num_experts == 128  # from model/qwen3_30b_a3b.yaml
    assert cfg.algorithm.name == "gspo"  # from algorithm/gspo.yaml
    assert cfg.cluster.gpus_per_node == 8  # from cluster/slurm_h100.yaml
    assert cfg.trainer.expert_parallel == 8  # the recipe body on top


def test_overrides_typed_and_nested():
    cfg = load_config(
        "moe_grpo",
        [
            "nodes=128",
            "trainer.tensor_parallel=4",
            "rollout.placement=disaggregated",
            "rollout.stop=[a, b]",
            "cluster.account=proj1",
        ],
    )
    assert cfg.nodes == 128 and cfg.trainer.tensor_parallel == 4
    assert cfg.rollout.placement == "disaggregated" and cfg.rollout.stop == ["a", "b"]
    assert cfg.cluster.account == "proj1"


def test_group_override_swaps_a_defaults_entry():
    cfg = load_config("tiny_grpo", ["model=tiny_qwen3_moe", "algorithm=dapo"])
    assert cfg.model.arch == "qwen3_moe"
    assert cfg.algorithm.name == "dapo" and cfg.algorithm.clip_high == 0.28
    assert cfg.algorithm.group_size == 8  # the recipe body still applies on top of the swapped group


def test_recipe_inherits_another_recipe(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "m.yaml").write_text("hidden_size: 64\nnum_attention_heads: 2\nnum_query_groups: 1\n")
    (tmp_path / "base.yaml").write_text("defaults:\n  - model: m\nrun:\n  steps: 7\n")
    (tmp_path / "child.yaml").write_text("defaults:\n  - base\nrun:\n  seed: 3\n")
    cfg = load_config("child", recipes_dir=tmp_path)
    assert (cfg.run.steps, cfg.run.seed, cfg.model.hidden_size) == (7, 3, 64)


def test_unknown_key_names_key_and_closest():
    with pytest.raises(ConfigError) as err:
        load_config("tiny_grpo", ["trainer.tensor_paralel=2"])
    assert "trainer.tensor_paralel" in str(err.value) and "'tensor_parallel'" in str(err.value)


def test_unknown_top_level_section():
    with pytest.raises(ConfigError, match=r"unknown key 'trainr'.*did you mean 'trainer'"):
        load_config("tiny_grpo", ["trainr.lr=1"])


def test_unknown_key_in_recipe_file(tmp_path):
    (tmp_path / "r.yaml").write_text("rollout:\n  temprature: 0.5\n")
    with pytest.raises(ConfigError, match=r"rollout.temprature.*'temperature'"):
        load_config("r", recipes_dir=tmp_path)


def test_wrong_type_names_path_value_and_allowed():
    with pytest.raises(ConfigError) as err:
        load_config("tiny_grpo", ["trainer.tensor_parallel=four"])
    msg = str(err.value)
    assert "trainer.tensor_parallel" in msg and "'four'" in msg and "integer" in msg


def test_wrong_literal_lists_allowed_values():
    with pytest.raises(ConfigError) as err:
        load_config("tiny_grpo", ["rollout.placement=shared"])
    msg = str(err.value)
    assert "rollout.placement" in msg and "'shared'" in msg and "colocated" in msg and "disaggregated" in msg


def test_out_of_range_value():
    with pytest.raises(ConfigError, match=r"trainer.micro_batch_size: got 0; .*greater than or equal to 1"):
        load_config("tiny_grpo", ["trainer.micro_batch_size=0"])


def test_cross_field_checks():
    with pytest.raises(ConfigError, match="multiple of model.num_query_groups"):
        load_config("tiny_grpo", ["model.num_query_groups=3"])
    with pytest.raises(ConfigError, match="expert_parallel=2 needs an MoE model"):
        load_config("tiny_grpo", ["trainer.expert_parallel=2"])


def test_unknown_recipe_and_group_choice():
    with pytest.raises(ConfigError, match=r"unknown recipe 'tiny_grp'.*did you mean 'tiny_grpo'"):
        load_config("tiny_grp")
    with pytest.raises(ConfigError, match=r"no 'model' named 'tiny_lama'.*did you mean 'tiny_llama'"):
        load_config("tiny_grpo", ["model=tiny_lama"])


def test_malformed_overrides():
    for bad in ["nodes", "=3", "a..b=1", "nodes=[1,"]:
        with pytest.raises(ConfigError, match="override"):
            load_config("tiny_grpo", [bad])
    with pytest.raises(ConfigError, match="run.seed is a value"):
        load_config("tiny_grpo", ["run.seed.x=1"])


def test_bad_yaml_and_bad_defaults(tmp_path):
    (tmp_path / "broken.yaml").write_text("run: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config("broken", recipes_dir=tmp_path)
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config("list", recipes_dir=tmp_path)
    (tmp_path / "cycle.yaml").write_text("defaults:\n  - cycle\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config("cycle", recipes_dir=tmp_path)
    (tmp_path / "bad_entry.yaml").write_text("defaults:\n  - {a: 1, b: 2}\n")
    with pytest.raises(ConfigError, match="defaults entry"):
        load_config("bad_entry", recipes_dir=tmp_path)


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config("dense_grpo", ["nodes=16"])
    path = save_resolved(cfg, tmp_path / "run")
    again = validate_tree(yaml.safe_load(path.read_text()))
    assert again == cfg
    assert "lr_warmup_steps" in path.read_text()  # every default filled in, not just what was set


def test_config_is_importable_without_torch():
    import subprocess
    import sys

    code = "import sys, hetrl.config, hetrl.control.plan, hetrl.trainer.shards; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent)


def test_weight_sync_buckets_default_by_device():
    from hetrl.config.rollout import RolloutConfig

    assert RolloutConfig().weight_sync_bucket_bytes(on_gpu=False) == 16 << 20  # gloo reuses buffers this size
    assert RolloutConfig().weight_sync_bucket_bytes(on_gpu=True) == 256 << 20
    assert RolloutConfig(weight_sync_bucket_mb=64).weight_sync_bucket_bytes(on_gpu=False) == 64 << 20


def test_a_run_dir_written_with_the_removed_stalled_role_guard_still_validates():
    """monitor.guards.stalled_role gave way to the liveness watchdog; older run dirs must still resume."""
    from hetrl.config.monitor import MonitorConfig

    with pytest.warns(DeprecationWarning, match="liveness watchdog"):
        cfg = MonitorConfig.model_validate({"guards": {"stalled_role": {"timeout_s": 900.0}}})
    assert "stalled_role" not in cfg.guards.model_dump()


def test_engine_dtype_follows_the_trainer_unless_the_recipe_says():
    assert load_config("tiny_grpo").engine_dtype == "float32"
    assert (
        load_config("tiny_grpo", ["trainer.precision=bf16"]).engine_dtype == "bfloat16"
    )  # bf16 runs on CPU profiles too
    assert load_config("dense_grpo").engine_dtype == "bfloat16"
    assert load_config("tiny_grpo", ["trainer.precision=bf16", "rollout.dtype=float32"]).engine_dtype == "float32"
