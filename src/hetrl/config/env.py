"""``env:`` — which environment episodes run in and where its tasks come from.

Environment and task-source names resolve through allowlists in ``hetrl.env.registry`` (a recipe
can never import arbitrary code); the names are checked here too, so that a misspelt one is refused
on the login node rather than by the first rollout rank.
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from hetrl.config.base import Section

# The keys of hetrl.env.registry's ENVIRONMENTS and TASK_SOURCES (a test keeps them equal).
ENVIRONMENT_NAMES = ("code", "math", "multimodal", "openenv", "screen", "terminal", "tool_math")
TASK_SOURCE_NAMES = ("file", "file_ops", "human_eval", "openenv", "reasoning_gym", "screen_tasks", "shapes")
# OpenEnv server apps a run may start itself (env.openenv.app): an allowlist like the names above, so a
# recipe never imports arbitrary code. Any other OpenEnv environment is served by its own uvicorn and
# named by env.openenv.url; or add its "module:attribute" here.
OPENENV_APPS = ("hetrl.env.envs.openenv_guess:app",)


def _check_name(value: str, names: tuple[str, ...], kind: str) -> str:
    if value not in names:
        close = difflib.get_close_matches(value, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown {kind} {value!r}{hint}; valid names: {', '.join(names)}")
    return value


class TaskSourceConfig(Section):
    source: str = Field(
        "reasoning_gym",
        description="Task source: reasoning_gym, human_eval, file (JSONL/Parquet), file_ops (terminal tasks), shapes "
        "(image questions), screen_tasks (GUI tasks), openenv (episode slots: an OpenEnv environment makes each "
        "problem from the episode's seed).",
    )
    name: str = Field(
        "basic_arithmetic", description="reasoning_gym dataset name (e.g. basic_arithmetic, countdown, gsm_symbolic)."
    )
    path: str | None = Field(None, description="source=file: path of the JSONL or Parquet file.")
    size: int = Field(
        10000,
        ge=1,
        description="Procedural sources (reasoning_gym, file_ops, shapes, screen_tasks, openenv): tasks to draw (the "
        "stream cycles through them, reshuffled per epoch).",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="source=reasoning_gym: extra keyword arguments of the dataset (e.g. min_terms); source=shapes: "
        "questions (colour, kind, total, which_colour), min_shapes, max_shapes, fill; source=openenv: demonstrations "
        "(a list of valid first replies, one drawn per task as its answer: what warm_start teaches, since hetrl "
        "cannot know an OpenEnv environment's answers).",
    )
    answer_instruction: str | None = Field(
        None,
        description="source=reasoning_gym or shapes: the sentence after each question that says how to format the "
        "answer; null = "
        'the source\'s own (answer inside <answer></answer> tags), "" = none (e.g. when a warm start teaches the '
        "format).",
    )

    @field_validator("source")
    @classmethod
    def _known_source(cls, v: str) -> str:
        return _check_name(v, TASK_SOURCE_NAMES, "task source")

    @model_validator(mode="after")
    def _check_source_keys(self) -> TaskSourceConfig:
        if self.source == "file" and self.path is None:
            raise ValueError("path is required when source is 'file': set it to the JSONL or Parquet file of tasks")
        if self.source == "openenv" and set(self.options) - {"demonstrations"}:
            raise ValueError(
                f"options {sorted(set(self.options) - {'demonstrations'})} are not options of task source 'openenv' "
                "(valid: demonstrations)"
            )
        if self.source not in ("reasoning_gym", "shapes"):
            unused = [("answer_instruction", self.answer_instruction, "null", "reasoning_gym and shapes")]
            if self.source != "openenv":
                unused.insert(0, ("options", self.options or None, "{}", "reasoning_gym, shapes and openenv"))
            for key, value, unset, users in unused:
                if value is not None:
                    raise ValueError(
                        f"{key} is not used by task source {self.source!r} (only by {users}): set it to {unset}"
                    )
        return self


class OpenEnvConfig(Section):
    """``env.openenv``: the OpenEnv server episodes run on (``env.name: openenv``; docs/environments.md)."""

    url: str | None = Field(
        None,
        description="Base URL of a running OpenEnv server (http://host:port, as its uvicorn serves it); each episode "
        "opens one WebSocket session at <url>/ws. Exactly one of url and app.",
    )
    app: str | None = Field(
        None,
        description="An OpenEnv server app (module:attribute) that each process running episodes starts itself "
        "under uvicorn on 127.0.0.1 (a free port), once, and stops at exit; allowlisted: "
        + ", ".join(OPENENV_APPS)
        + ". Exactly one of url and app.",
    )
    timeout_s: float = Field(
        30.0,
        gt=0,
        description="Deadline of every wait on the server: its start (app), the schema request, the WebSocket "
        "connect, each reset and step answer, the close. A server that misses it fails the run with an error naming "
        "its URL.",
    )
    invalid_action_reward: float = Field(
        0.0,
        description="Reward of a turn whose text does not parse as the environment's action (its /schema): the turn "
        "is not sent; the policy is told why and how to reply, and the turn counts against env.max_turns.",
    )

    @field_validator("app")
    @classmethod
    def _allowlisted_app(cls, v: str | None) -> str | None:
        return v if v is None else _check_name(v, OPENENV_APPS, "OpenEnv app")

    @model_validator(mode="after")
    def _one_server(self) -> OpenEnvConfig:
        if (self.url is None) == (self.app is None):
            raise ValueError("set exactly one of url (a running server) and app (one each process starts)")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url={self.url!r} must start with http:// or https:// (the server's base URL)")
        return self


class EnvConfig(Section):
    name: str = Field(
        "math", description="Environment: math, code, tool_math, terminal, multimodal, screen, openenv (env.openenv)."
    )
    tasks: TaskSourceConfig = Field(default_factory=TaskSourceConfig, description="Training task source.")
    eval_tasks: TaskSourceConfig | None = Field(
        None,
        description="Held-out task source for evaluation; null = the tasks config, generated and drawn under seed "
        "run.seed + 1000003. Either way, training tasks with the content of a held-out task are removed from "
        "training, unless they are over a quarter of its distinct tasks (the task space is too small to split): then "
        "the launcher refuses the recipe, unless eval.allow_training_overlap=true, under which training keeps them and "
        "the run reports a training-set reward (summary.json: held_out_split).",
    )
    system_prompt: str | None = Field(
        None, description="System message prepended to every episode; null = the environment's own."
    )
    max_turns: int = Field(1, ge=1, description="Turn budget per episode.")
    max_episode_tokens: int = Field(512, ge=16, description="Token budget per episode (prompt + all turns).")
    concurrency: int | None = Field(
        None,
        ge=1,
        description="Most episodes a rollout rank runs at once (each holds its environment: a process, a sandbox, an "
        "env "
        "rank's slot); the others wait for a free one. null = every episode the rank is sent, which the engine batches "
        "up to rollout.max_num_seqs.",
    )
    placement: Literal["inline", "role"] = Field(
        "inline",
        description="Where environments run: inline = inside the rollout ranks, next to the engine; role = on "
        "env-server "
        "ranks of their own on the CPU partition (cluster.env_workers_per_node per CPU node), which the rollout ranks "
        "drive over the control plane (only tasks, messages and step results travel; the sampled token ids stay with "
        "the rollout). Use role when environment steps are heavy (sandboxed tools, terminals) or must not share the "
        "GPU nodes' cores.",
    )
    call_timeout_s: float = Field(
        300.0,
        gt=0,
        description="placement=role: an env call (reset, step, close) its env rank has not answered this long fails "
        "its episode, which the orchestrator runs again under the same sample id on an env rank still up, as when "
        "the rank goes down. Keep it above the slowest environment step (a sandboxed tool's "
        "reward.sandbox.limits.wall_s).",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Extra keyword arguments of the environment (e.g. code: max_attempts)."
    )
    openenv: OpenEnvConfig | None = Field(
        None, description="name=openenv: its server (required then, refused otherwise); see docs/environments.md."
    )

    @field_validator("name")
    @classmethod
    def _known_name(cls, v: str) -> str:
        return _check_name(v, ENVIRONMENT_NAMES, "environment")

    @model_validator(mode="after")
    def _openenv_section(self) -> EnvConfig:
        if (self.name == "openenv") != (self.openenv is not None):
            raise ValueError(
                "openenv: set it (url or app) for name=openenv"
                if self.name == "openenv"
                else f"openenv is only read by name=openenv, not {self.name!r}: remove it"
            )
        return self
