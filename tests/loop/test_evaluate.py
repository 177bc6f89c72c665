"""Standalone eval (``hetrl.loop.evaluate``, ``launch.py eval``): format detection and the errors a user
sees before anything heavy starts. Scoring real checkpoints against a run's own evals is in
tests/monitor/test_real_run.py (slow: it needs a real run).
"""

from pathlib import Path
from types import SimpleNamespace

import pytest

from hetrl.config.loader import load_config, save_resolved
from hetrl.launch.cli import main
from hetrl.loop.evaluate import check_model_shape, eval_sampling, evaluate_checkpoint
from hetrl.loop.export import CheckpointError, resolve_checkpoint
from hetrl.loop.orchestrator import Orchestrator
from hetrl.models.hf import hf_config_dict


def fake_hf_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"")
    return path


def fake_trainer_run(run_dir: Path, overrides: list[str] = ()) -> Path:
    """A run directory with its config.yaml and a step dir that looks complete (no real tensors)."""
    save_resolved(load_config("tiny_grpo", list(overrides)), run_dir)
    step = run_dir / "checkpoints" / "step_00000003"
    step.mkdir(parents=True)
    (step / "metadata.json").write_text("{}")
    (step / "common.pt").write_bytes(b"")
    (run_dir / "checkpoints" / "latest").write_text("step_00000003\n")
    return run_dir / "checkpoints"


def test_resolve_formats(tmp_path):
    hf = fake_hf_dir(tmp_path / "hf")
    root = fake_trainer_run(tmp_path / "run")
    assert resolve_checkpoint(hf) == ("hf", hf)
    assert resolve_checkpoint(root) == ("trainer", root / "step_00000003")
    assert resolve_checkpoint(root / "step_00000003") == ("trainer", root / "step_00000003")


def test_resolve_errors(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "step_00000001.tmp").mkdir()
    (tmp_path / "no_weights").mkdir()
    (tmp_path / "no_weights" / "config.json").write_text("{}")
    for name, message in [
        ("missing", "does not exist"),
        ("file", "is a file"),
        ("empty", "neither an HF checkpoint"),
        ("step_00000001.tmp", "unfinished"),
        ("no_weights", "neither an HF checkpoint"),
    ]:
        with pytest.raises(CheckpointError, match=message):
            resolve_checkpoint(tmp_path / name)


def test_model_shape_check():
    model = load_config("tiny_grpo").model
    check_model_shape(model, {**hf_config_dict(model), "architectures": ["LlamaForCausalLM"]}, "x")
    wider = 2 * model.hidden_size
    with pytest.raises(CheckpointError, match=f"hidden_size: recipe {model.hidden_size}, checkpoint {wider}"):
        check_model_shape(model, {**hf_config_dict(model), "hidden_size": wider}, "x")
    with pytest.raises(CheckpointError, match="architecture"):
        check_model_shape(model, {**hf_config_dict(model), "architectures": ["Qwen2ForCausalLM"]}, "x")


def test_model_shape_check_of_a_vision_language_checkpoint():
    from hetrl.models.hf import hf_config

    model = load_config("tiny_vlm_grpo").model
    saved = hf_config(model).to_dict()  # what config.json of a LLaVA checkpoint holds: text and vision nested
    check_model_shape(model, saved, "x")
    with pytest.raises(CheckpointError, match="vision.patch_size: recipe 16, checkpoint 8"):
        check_model_shape(model, {**saved, "vision_config": {**saved["vision_config"], "patch_size": 8}}, "x")
    with pytest.raises(CheckpointError, match="num_hidden_layers: recipe 2, checkpoint 3"):
        check_model_shape(model, {**saved, "text_config": {**saved["text_config"], "num_hidden_layers": 3}}, "x")
    from hetrl.loop.evaluate import _recipe_config

    other = load_config(
        "tiny_vlm_grpo", ["model.vision.patch_size=8"]
    ).model  # what a trainer checkpoint's run config says
    with pytest.raises(CheckpointError, match="vision.patch_size: recipe 16, checkpoint 8"):
        check_model_shape(model, {**_recipe_config(other), "architectures": ["LlavaForConditionalGeneration"]}, "x")
    with pytest.raises(CheckpointError, match="architecture: recipe LlavaForConditionalGeneration"):
        check_model_shape(
            model, {**hf_config_dict(load_config("tiny_grpo").model), "architectures": ["LlamaForCausalLM"]}, "x"
        )


def test_trainer_checkpoint_of_another_shape_is_refused_before_loading(tmp_path):
    root = fake_trainer_run(tmp_path / "run", ["model.num_layers=3"])
    with pytest.raises(CheckpointError, match="num_hidden_layers: recipe 2, checkpoint 3"):
        evaluate_checkpoint(load_config("tiny_grpo"), root)


def test_eval_sampling_is_the_loops():
    """The standalone eval must sample exactly as the orchestrator's eval does, or the two disagree."""
    cfg = load_config("tiny_grpo", ["eval.temperature=0.5", "rollout.max_tokens=17"])
    loop_side = Orchestrator.sampling(SimpleNamespace(cfg=cfg, tokenizer=SimpleNamespace(eos_token_id=2)), "eval")
    assert eval_sampling(cfg, 2) == loop_side


def test_cli_errors(tmp_path, capsys):
    def said() -> str:
        return " ".join(capsys.readouterr().err.split())  # rich wraps long lines

    assert main(["eval"]) == 2
    assert "checkpoint=PATH" in said()
    assert main(["eval", f"checkpoint={tmp_path / 'nope'}"]) == 2
    assert "does not exist" in said()
    assert main(["eval", f"checkpoint={fake_hf_dir(tmp_path / 'hf')}", "model.hidden_sise=3"]) == 2
    assert "hidden_sise" in said()
    assert main(["eval", "checkpoint=x", "stray"]) == 2
    assert "'checkpoint=x stray'" in said()
