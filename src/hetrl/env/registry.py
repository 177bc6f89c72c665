"""Names a recipe may use for environments and task sources, and the builders that resolve them.

Both are allowlists (name -> "module:attribute", imported only when used): a recipe selects among
shipped components but can never make a worker import arbitrary code. A new environment is one
line here (see docs/environments.md).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from hetrl.config.env import EnvConfig, TaskSourceConfig
from hetrl.config.reward import SandboxConfig
from hetrl.env.base import Environment, Task
from hetrl.env.execution import CodeRunner, SandboxRunner
from hetrl.env.tasks.base import TaskSource, TaskStream
from hetrl.env.tasks.split import HeldOutSplit, draw_held_out, split_held_out

# The held-out draw of a run is generated (procedural sources) and ordered under run.seed + this.
EVAL_SEED_OFFSET = 1_000_003

ENVIRONMENTS: dict[str, str] = {
    "math": "hetrl.env.envs.single_answer:MathEnv",
    "code": "hetrl.env.envs.coding:CodeEnv",
    "tool_math": "hetrl.env.envs.tool_use:ToolMathEnv",
    "terminal": "hetrl.env.envs.terminal:TerminalEnv",
    "multimodal": "hetrl.env.envs.multimodal:MultimodalEnv",
    "screen": "hetrl.env.envs.screen:ScreenEnv",
    "openenv": "hetrl.env.envs.openenv_adapter:OpenEnvEnv",
}

TASK_SOURCES: dict[str, str] = {
    "reasoning_gym": "hetrl.env.tasks.reasoning_gym:ReasoningGymSource",
    "human_eval": "hetrl.env.tasks.human_eval:HumanEvalSource",
    "file": "hetrl.env.tasks.files:FileSource",
    "file_ops": "hetrl.env.envs.terminal:FileOpsSource",
    "shapes": "hetrl.env.envs.multimodal:ShapesSource",
    "screen_tasks": "hetrl.env.envs.screen:ScreenTaskSource",
    "openenv": "hetrl.env.envs.openenv_adapter:OpenEnvSource",
}


def _resolve(table: dict[str, str], name: str, kind: str) -> Any:
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; valid names: {', '.join(sorted(table))}")
    module, _, attribute = table[name].partition(":")
    return getattr(importlib.import_module(module), attribute)


_shared: tuple[SandboxConfig, CodeRunner] | None = None  # this process's runner and the settings it was built with


def shared_runner(sandbox: SandboxConfig) -> CodeRunner:
    """One sandbox pool per process, shared by every episode that runs code, built with ``sandbox``
    (the recipe's ``reward.sandbox``); asking for it with other settings later is an error, not ignored."""
    global _shared
    if _shared is None:
        _shared = (sandbox, SandboxRunner(config=sandbox))
    elif _shared[0] != sandbox:
        raise RuntimeError(
            "this process's environment sandbox was built with other reward.sandbox settings; one pool serves "
            "every episode of a process"
        )
    return _shared[1]


def env_factory(
    cfg: EnvConfig, runner: CodeRunner | None = None, sandbox: SandboxConfig | None = None
) -> Callable[[], Environment]:
    """A zero-argument constructor of fresh environments (one per concurrent episode) for ``cfg``.

    Environments that run code use ``runner``, else the process's shared runner with the
    ``sandbox`` settings (a run passes ``cfg.reward.sandbox``; None: the built-in defaults).
    """
    cls = _resolve(ENVIRONMENTS, cfg.name, "environment")
    params = inspect.signature(cls).parameters
    unknown = sorted(set(cfg.options) - set(params) - {"runner", "system_prompt", "openenv"})
    if unknown:
        valid = sorted(set(params) - {"runner", "system_prompt", "openenv"})
        raise ValueError(f"env.options {unknown} are not options of environment {cfg.name!r}; valid: {valid}")
    kwargs = {**cfg.options, "system_prompt": cfg.system_prompt}
    if "openenv" in params:  # the OpenEnv adapter's server (env.openenv), a typed section rather than options
        kwargs["openenv"] = cfg.openenv
    needs_runner = "runner" in params

    def make() -> Environment:
        if needs_runner:  # resolved per call, so a config-only process never starts a sandbox pool
            return cls(runner=runner or shared_runner(sandbox or SandboxConfig()), **kwargs)
        return cls(**kwargs)

    return make


def build_env(cfg: EnvConfig, runner: CodeRunner | None = None, sandbox: SandboxConfig | None = None) -> Environment:
    """One environment instance for ``cfg`` (code-running ones share ``runner`` or the process's pool)."""
    return env_factory(cfg, runner, sandbox)()


def build_task_source(cfg: TaskSourceConfig, seed: int) -> TaskSource:
    """The task source ``cfg`` names; procedural sources are fixed by ``seed``."""
    cls = _resolve(TASK_SOURCES, cfg.source, "task source")
    if cfg.source == "file":
        if cfg.path is None:
            raise ValueError("env.tasks.path is required when env.tasks.source is 'file'")
        return cls(cfg.path)
    if cfg.source == "reasoning_gym":
        return cls(cfg.name, size=cfg.size, seed=seed, options=cfg.options, answer_instruction=cfg.answer_instruction)
    if cfg.source == "shapes":
        return cls(size=cfg.size, seed=seed, options=cfg.options, answer_instruction=cfg.answer_instruction)
    if cfg.source == "openenv":
        return cls(size=cfg.size, seed=seed, demonstrations=cfg.options.get("demonstrations"))
    for key, value in (("options", cfg.options or None), ("answer_instruction", cfg.answer_instruction)):
        if value is not None:
            raise ValueError(
                f"env.tasks.{key} is not used by task source {cfg.source!r} (only by reasoning_gym and shapes): "
                f"set it to {'{}' if key == 'options' else 'null'}"
            )
    return cls() if cfg.source == "human_eval" else cls(size=cfg.size, seed=seed)


def build_task_stream(cfg: TaskSourceConfig, seed: int, shuffle: bool = True) -> TaskStream:
    return TaskStream(build_task_source(cfg, seed), seed=seed, shuffle=shuffle)


def _eval_source(cfg: EnvConfig, seed: int) -> tuple[TaskSource, int]:
    """The source of a run's held-out draw and the draw's seed: ``env.eval_tasks``, else the training config."""
    eval_seed = seed + EVAL_SEED_OFFSET
    return build_task_source(cfg.eval_tasks or cfg.tasks, eval_seed), eval_seed


def build_held_out(cfg: EnvConfig, seed: int, num_tasks: int) -> list[tuple[Task, int]]:
    """The held-out draw of a run with ``seed`` (what ``build_held_out_split`` holds out, without the training side)."""
    return draw_held_out(*_eval_source(cfg, seed), num_tasks)


def build_held_out_split(cfg: EnvConfig, seed: int, num_eval_tasks: int) -> HeldOutSplit:
    """The held-out draw and the training source (generated under ``seed``) without it; see hetrl.env.tasks.split."""
    eval_source, eval_seed = _eval_source(cfg, seed)
    held_out = draw_held_out(eval_source, eval_seed, num_eval_tasks)
    return split_held_out(build_task_source(cfg.tasks, seed), held_out, eval_source)
