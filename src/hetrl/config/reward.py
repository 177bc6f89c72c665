"""``reward:`` — how finished rollouts are scored: the rubric, the sandbox, reward models, the judge.

Reward functions are named in the recipe and resolved through ``REWARD_ALLOWLIST`` (name ->
``"module:attr"``, imported lazily by ``hetrl.reward.rubric``): a recipe file can pick and weight
functions but never import arbitrary code. Zero-weight functions are computed as metrics only.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from hetrl.config.base import Section

# name -> "module:attr"; attr is a factory called with the function's kwargs, returning a callable
# ``f(sample) -> float | RewardValue``. Adding a reward function means adding a line here.
REWARD_ALLOWLIST: dict[str, str] = {
    "math": "hetrl.reward.math:MathReward",
    "code": "hetrl.reward.code:CodeReward",
    "format": "hetrl.reward.shaping:FormatReward",
    "overlong": "hetrl.reward.shaping:OverlongPenalty",
    "length": "hetrl.reward.shaping:LengthPenalty",
    "repetition": "hetrl.reward.shaping:RepetitionPenalty",
    "closeness": "hetrl.reward.shaping:NumericCloseness",
    "reward_model": "hetrl.reward.reward_model:RewardModelReward",
    "judge": "hetrl.reward.judge:JudgeReward",
}


class RewardFunctionConfig(Section):
    name: str = Field(description="Reward function name, one of REWARD_ALLOWLIST (math, code, format, overlong, length, repetition, closeness, reward_model, judge).")
    weight: float = Field(1.0, description="Weight in the total reward; 0 computes it as a metric only.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments passed to the reward function's constructor.")
    source: str | None = Field(None, description="Name under which its value appears in per_source/metrics; defaults to `name` (set it to use one function twice).")

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in REWARD_ALLOWLIST:
            import difflib

            hint = difflib.get_close_matches(v, REWARD_ALLOWLIST, n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ValueError(f"unknown reward function {v!r}{extra}; valid: {sorted(REWARD_ALLOWLIST)}")
        return v

    @property
    def resolved_source(self) -> str:
        return self.source or self.name


class SandboxLimits(Section):
    """Per-execution limits of the code sandbox (each enforced by the kernel, not by the program)."""

    wall_s: float = Field(10.0, gt=0, description="Wall-clock deadline in seconds; the whole process tree is killed at it.")
    cpu_s: int = Field(10, ge=1, description="CPU-time limit per process in seconds (RLIMIT_CPU).")
    memory_mb: int = Field(512, ge=16, description="Address-space limit per process in MiB (RLIMIT_AS).")
    max_processes: int = Field(32, ge=1, description="Processes/threads the program may run at once (RLIMIT_NPROC on a per-slot uid).")
    max_open_files: int = Field(64, ge=8, description="Open file descriptors per process (RLIMIT_NOFILE).")
    max_output_bytes: int = Field(1 << 20, ge=1024, description="Bytes of stdout and of stderr kept; beyond it the program is killed and the output marked truncated.")
    max_file_bytes: int = Field(16 << 20, ge=0, description="Largest file the program may write (RLIMIT_FSIZE).")
    tmpfs_mb: int = Field(64, ge=1, description="Size of the private writable /tmp and working directory in MiB.")


class SandboxConfig(Section):
    limits: SandboxLimits = Field(default_factory=SandboxLimits, description="Default per-execution limits.")
    workers: int = Field(2, ge=1, description="Concurrent sandboxed executions per reward worker process.")
    python: str = Field("/usr/bin/python3", description="Interpreter used inside the sandbox (must live under a read-only bound path).")
    ro_binds: list[str] = Field(
        default_factory=lambda: ["/usr", "/lib", "/lib64", "/bin", "/etc/alternatives"],
        description="Host paths bound read-only into the sandbox (missing ones are skipped). Nothing else of the host is visible.",
    )
    allow_unisolated: bool = Field(
        False, description="Run untrusted code WITHOUT bubblewrap isolation when the machine allows none (loud warning). Never on shared machines."
    )
    seccomp: bool = Field(True, description="Install the seccomp deny-list (ptrace, mount, bpf, keyctl, ...) where the architecture is supported.")
    uid_base: int = Field(61000, ge=1000, description="When run as root, slot i runs as uid/gid uid_base+i so per-uid process limits hold per slot.")


class JudgeConfig(Section):
    rubric: str = Field(
        "Score how correct, complete and helpful the response is for the prompt.", description="Rubric text shown to the judge model."
    )
    min_score: float = Field(0.0, description="Lowest score on the judge's scale.")
    max_score: float = Field(10.0, description="Highest score on the judge's scale; verdicts are normalised to [0, 1].")
    max_retries: int = Field(2, ge=0, description="Extra judge calls when a verdict cannot be parsed.")
    default_score: float = Field(0.0, ge=0.0, le=1.0, description="Normalised score used when the judge fails every try (counted in metrics).")
    max_response_chars: int = Field(8000, ge=100, description="Response characters shown to the judge (the rest is cut, marked as cut).")


class RewardModelConfig(Section):
    path: str | None = Field(None, description="HF checkpoint directory of a sequence-classification reward model; null disables it.")
    batch_size: int = Field(8, ge=1, description="Requests scored per forward pass.")
    max_length: int = Field(2048, ge=8, description="Tokens per scored sequence (longer ones are truncated from the left).")


class RewardConfig(Section):
    functions: list[RewardFunctionConfig] = Field(
        default_factory=lambda: [RewardFunctionConfig(name="math")], description="Weighted reward functions; zero-weight ones are metrics."
    )
    workers: int = Field(1, ge=1, description="Reward worker processes (the CPU partition role).")
    clip_min: float = Field(-10.0, description="Totals below this are clipped and flagged (out-of-range reward).")
    clip_max: float = Field(10.0, description="Totals above this are clipped and flagged (out-of-range reward).")
    math_timeout_s: float = Field(5.0, gt=0, description="Deadline of one math-verify call (our own; its signal timeout is disabled).")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="Code sandbox settings.")
    judge: JudgeConfig = Field(default_factory=JudgeConfig, description="LLM-as-judge settings.")
    reward_model: RewardModelConfig = Field(default_factory=RewardModelConfig, description="Sequence-classification reward model settings.")
