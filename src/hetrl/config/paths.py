"""Login-node checks of the files a validated recipe names: each must be there before the job is.

``launch.py`` runs :func:`check_paths` after validation and before planning, so that a missing
checkpoint is refused by the dry run rather than by the first rank to open it. These are not schema
validators: every rank validates the resolved config again, and a notebook may compose a recipe
on a machine that lacks the files. Relative paths are taken from the current directory, as the
job's processes take them.
"""

from __future__ import annotations

import json
from pathlib import Path

from hetrl.config.loader import ConfigError
from hetrl.config.reward import POLICY_MODEL
from hetrl.config.schema import HetrlConfig

# critic.init values that name no path (hetrl.trainer.critic.ValueTrainer.load_initial_weights).
CRITIC_INITS = ("policy", "fresh")


def check_paths(cfg: HetrlConfig) -> None:
    """Raise :class:`ConfigError` listing every named file or directory that is missing or incomplete."""
    problems = []
    if cfg.model.hf_checkpoint is not None:
        problems += _hf_checkpoint_problems("model.hf_checkpoint", cfg.model.hf_checkpoint)
        if cfg.model.is_vlm and not problems:
            problems += _llava_problems(cfg.model.hf_checkpoint, cfg.model.vision.image_size)
    if cfg.algorithm.name == "ppo" and cfg.critic.init not in CRITIC_INITS:
        if Path(cfg.critic.init).exists():
            problems += _hf_checkpoint_problems("critic.init", cfg.critic.init)
        else:
            problems.append(
                f"critic.init={cfg.critic.init!r} is neither 'policy' nor 'fresh' nor an existing path (an HF "
                "token-classification checkpoint directory)"
            )
    served = {
        "judge": ("reward.judge.model", cfg.reward.judge.model),
        "reward_model": ("reward.reward_model.path", cfg.reward.reward_model.path),
    }
    for name in cfg.reward.served_models:
        key, path = served[name]
        if path != POLICY_MODEL:
            problems += _hf_checkpoint_problems(key, path)
    for key, tasks in (("env.tasks", cfg.env.tasks), ("env.eval_tasks", cfg.env.eval_tasks)):
        if tasks is not None and tasks.source == "file" and tasks.path is not None and not Path(tasks.path).is_file():
            problems.append(f"{key}.path={tasks.path!r} is not a file (a JSONL or Parquet file of tasks)")
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def _hf_checkpoint_problems(key: str, path: str) -> list[str]:
    """What keeps ``path`` from being an HF checkpoint directory the trainer and vLLM can load."""
    directory = Path(path)
    if not directory.is_dir():
        return [
            f"{key}={path!r} is not a directory: point it at an HF checkpoint directory (config.json + *.safetensors)"
        ]
    missing = [
        name
        for name, present in (
            ("config.json", (directory / "config.json").is_file()),
            ("*.safetensors", any(directory.glob("*.safetensors"))),
        )
        if not present
    ]
    return [f"{key}={path!r} has no {' and no '.join(missing)}: not an HF checkpoint directory"] if missing else []


# What hetrl's LLaVA implements (hetrl.trainer.vision): the last ViT layer's patches, the class token
# dropped, a GELU projector, images resized to the square without a crop. A checkpoint set up otherwise
# would be served one way by vLLM (which reads these files) and trained another.
_LLAVA_SETTINGS = {
    "model_type": "llava",
    "vision_feature_layer": -1,
    "vision_feature_select_strategy": "default",
    "projector_hidden_act": "gelu",
}


def _llava_problems(path: str, image_size: int) -> list[str]:
    """What keeps a vision-language checkpoint from being the LLaVA hetrl trains (config.json,
    preprocessor_config.json)."""
    directory = Path(path)
    config = json.loads((directory / "config.json").read_text())
    problems = [
        f"model.hf_checkpoint={path!r}: config.json has {key}={config.get(key)!r}; hetrl's LLaVA needs {value!r}"
        for key, value in _LLAVA_SETTINGS.items()
        if config.get(key, value if key != "model_type" else None) != value
    ]
    # transformers 5 nests the image processor in processor_config.json; older checkpoints have preprocessor_config.json
    nested, flat = directory / "processor_config.json", directory / "preprocessor_config.json"
    if nested.is_file() and "image_processor" in json.loads(nested.read_text()):
        settings = json.loads(nested.read_text())["image_processor"]
    elif flat.is_file():
        settings = json.loads(flat.read_text())
    else:
        return problems + [
            f"model.hf_checkpoint={path!r} has no image processor settings (processor_config.json or "
            "preprocessor_config.json: what vLLM processes images with)"
        ]
    square = {"height": image_size, "width": image_size}
    if settings.get("do_center_crop", True) or settings.get("size") != square:
        problems.append(
            f"model.hf_checkpoint={path!r}: the image processor must resize to {square} without a centre crop "
            f"(as the trainer does), got size={settings.get('size')!r}, "
            f"do_center_crop={settings.get('do_center_crop', True)!r}"
        )
    return problems
