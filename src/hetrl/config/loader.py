"""Recipe composition: YAML files with ``defaults:``, Hydra-style ``key=value`` overrides, validation.

A recipe is ``recipes/<name>.yaml``. Its ``defaults:`` list pulls in other files before the recipe's
own body is merged on top (later wins, dicts merge, lists and scalars replace):

    defaults:
      - model: qwen3_30b_a3b      # recipes/model/qwen3_30b_a3b.yaml  -> the `model:` section
      - algorithm: grpo           # recipes/algorithm/grpo.yaml       -> `algorithm:`
      - cluster: slurm_h100       # recipes/cluster/slurm_h100.yaml   -> `cluster:`
      - base                      # recipes/base.yaml, merged at the top level

Overrides are ``dotted.key=value`` with the value parsed as YAML (``4`` -> int, ``[a, b]`` -> list,
``null``); ``group=name`` swaps a defaults entry (``model=tiny_qwen3_moe``) when the file
``recipes/<group>/<name>.yaml`` exists. Every error is a :class:`ConfigError` that names the file
or dotted key, the offending value and what is allowed.
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from hetrl.config.schema import HetrlConfig

RECIPES_DIR = Path(__file__).resolve().parents[3] / "recipes"
_MAX_DEFAULTS_DEPTH = 16


class ConfigError(ValueError):
    """A recipe or override the schema rejects; the message is meant for the user, verbatim."""


def load_config(
    recipe: str, overrides: list[str] | tuple[str, ...] = (), recipes_dir: Path | None = None
) -> HetrlConfig:
    """Compose ``recipe`` (a name under ``recipes_dir`` or a path to a YAML file), apply overrides, validate."""
    recipes_dir = Path(recipes_dir or RECIPES_DIR)
    parsed = [_parse_override(o) for o in overrides]
    group_choices = {k: v for k, v in parsed if _is_group_choice(recipes_dir, k, v)}
    tree = _compose(_recipe_path(recipes_dir, recipe), recipes_dir, group_choices, depth=0)
    tree.setdefault("recipe", Path(recipe).stem)
    for key, value in parsed:
        if key not in group_choices:
            _set_dotted(tree, key, value)
    return validate_tree(tree)


def validate_tree(tree: dict[str, Any]) -> HetrlConfig:
    """Validate a composed tree, turning pydantic's report into one actionable message."""
    try:
        return HetrlConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None


def save_resolved(config: HetrlConfig, run_dir: Path) -> Path:
    """Write the fully resolved config (every default filled in) as ``run_dir/config.yaml``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return path


def available_recipes(recipes_dir: Path | None = None) -> list[str]:
    return sorted(p.stem for p in Path(recipes_dir or RECIPES_DIR).glob("*.yaml"))


def _recipe_path(recipes_dir: Path, recipe: str) -> Path:
    as_path = Path(recipe)
    if as_path.suffix in (".yaml", ".yml"):
        if not as_path.is_file():
            raise ConfigError(f"recipe file {recipe!r} does not exist")
        return as_path
    path = recipes_dir / f"{recipe}.yaml"
    if not path.is_file():
        names = available_recipes(recipes_dir)
        raise ConfigError(f"unknown recipe {recipe!r}{_did_you_mean(recipe, names)}; available: {', '.join(names)}")
    return path


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of keys, got {type(data).__name__}")
    return data


def _compose(path: Path, recipes_dir: Path, group_choices: dict[str, str], depth: int) -> dict[str, Any]:
    if depth > _MAX_DEFAULTS_DEPTH:
        raise ConfigError(f"{path}: defaults nest deeper than {_MAX_DEFAULTS_DEPTH} levels (a cycle?)")
    body = _read_yaml(path)
    defaults = body.pop("defaults", []) or []
    if not isinstance(defaults, list):
        raise ConfigError(f"{path}: 'defaults' must be a list, got {type(defaults).__name__}")
    tree: dict[str, Any] = {}
    for entry in defaults:
        if isinstance(entry, str):
            _deep_merge(tree, _compose(_recipe_path(recipes_dir, entry), recipes_dir, group_choices, depth + 1))
        elif isinstance(entry, dict) and len(entry) == 1:
            ((group, name),) = entry.items()
            name = group_choices.get(group, name)
            group_file = recipes_dir / group / f"{name}.yaml"
            if not group_file.is_file():
                options = sorted(p.stem for p in (recipes_dir / group).glob("*.yaml"))
                raise ConfigError(
                    f"{path}: no {group!r} named {name!r}{_did_you_mean(name, options)}; available: "
                    f"{', '.join(options) or 'none'}"
                )
            _deep_merge(tree, {group: _compose(group_file, recipes_dir, {}, depth + 1)})
        else:
            raise ConfigError(f"{path}: a defaults entry is 'name' or 'group: name', got {entry!r}")
    _deep_merge(tree, body)
    return tree


def _deep_merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def _parse_override(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} is not of the form dotted.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"override {text!r}: the value is not valid YAML: {err}") from None
    return key, value


def _is_group_choice(recipes_dir: Path, key: str, value: Any) -> bool:
    """``model=NAME`` picks recipes/model/NAME.yaml; a name with no such file is an error, not a value."""
    group_dir = recipes_dir / key
    if "." in key or not isinstance(value, str) or not group_dir.is_dir():
        return False
    if not (group_dir / f"{value}.yaml").is_file():
        options = sorted(p.stem for p in group_dir.glob("*.yaml"))
        raise ConfigError(
            f"override {key}={value}: no {key!r} named {value!r}{_did_you_mean(value, options)}; available: "
            f"{', '.join(options)}"
        )
    return True


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    node = tree
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key}=...: {'.'.join(parts[: i + 1])} is a value ({child!r}), not a section")
        node = child
    node[parts[-1]] = value


def _did_you_mean(word: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(word, candidates, n=3, cutoff=0.5)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def _fields_at(path: tuple[Any, ...]) -> list[str]:
    """Valid key names of the section at ``path`` (for did-you-mean on an unknown key)."""
    model: type[BaseModel] | None = HetrlConfig
    for part in path:
        field = model.model_fields.get(part) if model else None
        annotation = field.annotation if field else None
        model = next((a for a in _model_types(annotation)), None)
        if model is None:
            return []
    return list(model.model_fields) if model else []


def _model_types(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [a for a in getattr(annotation, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)]


def format_validation_error(err: ValidationError) -> str:
    lines = []
    for item in err.errors():
        loc = tuple(item["loc"])
        dotted = ".".join(str(p) for p in loc) or "<root>"
        if item["type"] == "extra_forbidden":
            valid = _fields_at(loc[:-1])
            hint = _did_you_mean(str(loc[-1]), valid)
            lines.append(f"unknown key {dotted!r}{hint}; valid keys here: {', '.join(valid)}")
        elif item["type"] == "value_error":
            reason = item["msg"].removeprefix("Value error, ")
            lines.append(f"{dotted}: {reason}" if loc else reason)
        else:
            lines.append(f"{dotted}: got {item.get('input')!r}; {item['msg']}")
    return "invalid config:\n  " + "\n  ".join(lines)
