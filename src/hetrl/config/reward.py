"""``reward:`` — how finished rollouts are scored: the rubric, the sandbox, reward models, the judge.

Reward functions are named in the recipe and resolved through ``REWARD_ALLOWLIST`` (name ->
``"module:attr"``, imported lazily by ``hetrl.reward.rubric``): a recipe file can pick and weight
functions but never import arbitrary code. Zero-weight functions are computed as metrics only.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from hetrl.config.base import Section

# name -> "module:attr"; attr is a factory called with the function's kwargs, returning a callable
# ``f(sample) -> float | RewardValue``. Adding a reward function means adding a line here.
REWARD_ALLOWLIST: dict[str, str] = {
    "math": "hetrl.reward.math_answers:MathReward",
    "code": "hetrl.reward.code_tests:CodeReward",
    "format": "hetrl.reward.shaping:FormatReward",
    "overlong": "hetrl.reward.shaping:OverlongPenalty",
    "length": "hetrl.reward.shaping:LengthPenalty",
    "repetition": "hetrl.reward.shaping:RepetitionPenalty",
    "closeness": "hetrl.reward.shaping:NumericCloseness",
    "reward_model": "hetrl.reward.reward_model:RewardModelReward",
    "judge": "hetrl.reward.judge:JudgeReward",
    "env": "hetrl.reward.environment:EnvironmentReward",
}
# The functions that read a completion's token ids (the others read its texts and its length): only for these are
# the ids sent to the reward ranks (hetrl.control.protocol.ScoringView).
READS_COMPLETION_IDS = frozenset({"repetition"})


class RewardFunctionConfig(Section):
    name: str = Field(
        description="Reward function name, one of REWARD_ALLOWLIST (math, code, format, overlong, length, repetition, "
        "closeness, reward_model, judge, env: the environment's own verdict)."
    )
    weight: float = Field(1.0, description="Weight in the total reward; 0 computes it as a metric only.")
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments passed to the reward function's constructor."
    )
    source: str | None = Field(
        None,
        description="Name under which its value appears in per_source/metrics; defaults to `name` (set it to use one "
        "function twice).",
    )

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

    wall_s: float = Field(
        10.0, gt=0, description="Wall-clock deadline in seconds; the whole process tree is killed at it."
    )
    cpu_s: int = Field(10, ge=1, description="CPU-time limit per process in seconds (RLIMIT_CPU).")
    memory_mb: int = Field(512, ge=16, description="Address-space limit per process in MiB (RLIMIT_AS).")
    max_processes: int = Field(
        32, ge=1, description="Processes/threads the program may run at once (RLIMIT_NPROC on a per-slot uid)."
    )
    max_open_files: int = Field(64, ge=8, description="Open file descriptors per process (RLIMIT_NOFILE).")
    max_output_bytes: int = Field(
        1 << 20,
        ge=1024,
        description="Bytes of stdout and of stderr kept; beyond it the program is killed and the output marked "
        "truncated.",
    )
    max_file_bytes: int = Field(16 << 20, ge=0, description="Largest file the program may write (RLIMIT_FSIZE).")
    tmpfs_mb: int = Field(64, ge=1, description="Size of the private writable /tmp and working directory in MiB.")


class SandboxConfig(Section):
    limits: SandboxLimits = Field(default_factory=SandboxLimits, description="Default per-execution limits.")
    workers: int = Field(
        4,
        ge=1,
        description="Sandboxed programs run at once per process (a reward rank's code tests, an env or rollout rank's "
        "episodes); "
        "at least reward.workers for code rewards, so no scoring thread waits for a slot held by a program running "
        "into its limits "
        "(mind the cores: a reward rank on 1-2 cores runs its programs side by side).",
    )
    python: str = Field(
        "/usr/bin/python3", description="Interpreter used inside the sandbox (must live under a read-only bound path)."
    )
    ro_binds: list[str] = Field(
        default_factory=lambda: ["/usr", "/lib", "/lib64", "/bin", "/etc/alternatives"],
        description="Host paths bound read-only into the sandbox (missing ones are skipped). Nothing else of the host "
        "is visible.",
    )
    allow_unisolated: bool = Field(
        False,
        description="Run untrusted code WITHOUT bubblewrap isolation when the machine allows none (loud warning). "
        "Never on shared machines.",
    )
    seccomp: bool = Field(
        True,
        description="Install the seccomp deny-list (ptrace, mount, bpf, keyctl, ...) where the architecture is "
        "supported.",
    )
    uid_base: int = Field(
        61000,
        ge=1000,
        description="When run as root, slot i runs as uid/gid uid_base+i so per-uid process limits hold per slot.",
    )


POLICY_MODEL = "policy"  # a served model's path that means: the run's initial policy checkpoint, frozen


class JudgeConfig(Section):
    model: str | None = Field(
        None,
        description="HF checkpoint directory of the judge model, served by the reward_server role; `policy` serves "
        "the run's initial "
        "policy checkpoint, frozen (self-judging). Needed when `judge` is among reward.functions.",
    )
    scoring: Literal["verdict", "expected"] = Field(
        "verdict",
        description="verdict: the judge writes a reason and <score>N</score> (greedy, parsed, retried); expected: the "
        "prompt ends in "
        "`<score>` and the score is the probability-weighted mean of the judge's next-token choices among the scale's "
        "integers "
        "(no parsing to fail; for small or base judges; the scale must be single digits, 0-9 at most).",
    )
    rubric: str = Field(
        "Score how correct, complete and helpful the response is for the prompt.",
        description="Rubric text shown to the judge model.",
    )
    min_score: float = Field(0.0, description="Lowest score on the judge's scale.")
    max_score: float = Field(10.0, description="Highest score on the judge's scale; verdicts are normalised to [0, 1].")
    max_retries: int = Field(2, ge=0, description="Extra judge calls when a verdict cannot be parsed.")
    default_score: float = Field(
        0.0, ge=0.0, le=1.0, description="Normalised score used when the judge fails every try (counted in metrics)."
    )
    max_response_chars: int = Field(
        8000, ge=100, description="Response characters shown to the judge (the rest is cut, marked as cut)."
    )
    template: str | None = Field(
        None,
        description="The judge's prompt, with placeholders {rubric} {prompt} {response} {nonce} {lo} {hi}; it must "
        "fence {response} "
        "between markers holding {nonce} (a random value per request the response cannot predict); null: the built-in "
        "prompt.",
    )
    max_tokens: int = Field(256, ge=1, description="Tokens the judge may write for one verdict (scoring=verdict).")
    top_logprobs: int = Field(20, ge=1, le=100, description="Next-token candidates read for scoring=expected.")
    max_model_len: int | None = Field(
        None, ge=16, description="The judge engine's context (prompt + verdict); null: the checkpoint's."
    )


class RewardModelConfig(Section):
    path: str | None = Field(
        None,
        description="HF checkpoint directory of a sequence-classification reward model, served by the reward_server "
        "role; `policy` "
        "puts a fresh scalar head (seeded by run.seed) on the run's initial policy. Needed when `reward_model` is "
        "among reward.functions.",
    )
    batch_size: int = Field(8, ge=1, description="Sequences scored per forward pass on a server.")
    max_length: int = Field(
        2048, ge=8, description="Tokens per scored sequence (longer ones are truncated from the left)."
    )


class RewardServerConfig(Section):
    """The reward_server role: replicas that serve the frozen judge and reward model to every reward worker."""

    replicas: int = Field(
        1,
        ge=1,
        description="Server ranks, each holding the judge and/or reward model the rubric uses (when it uses one).",
    )
    tensor_parallel: int = Field(
        1, ge=1, description="GPUs per replica (the judge engine's tensor parallelism); 1 on CPU."
    )
    partition: str | None = Field(
        None, description="Slurm partition of the servers' nodes; null: cluster.gpu_partition."
    )
    request_timeout_s: float = Field(
        300.0,
        gt=0,
        description="A request unanswered this long is sent to another replica (or failed when none is left).",
    )
    max_attempts: int = Field(
        3,
        ge=1,
        description="Replicas a request is tried on before it fails; its sample then scores 0 in total, flagged "
        "reward/unavailable:<source> and counted in reward/unavailable_frac, and is never scored again.",
    )
    gpu_memory_utilization: float = Field(
        0.85, gt=0.0, le=1.0, description="Share of each GPU the judge engine may take."
    )
    kv_cache_memory_mb: int = Field(256, ge=16, description="CPU only: the judge engine's KV cache in MiB.")


class RewardConfig(Section):
    functions: list[RewardFunctionConfig] = Field(
        default_factory=lambda: [RewardFunctionConfig(name="math")],
        description="Weighted reward functions; zero-weight ones are metrics.",
    )
    workers: int = Field(
        4,
        ge=1,
        description="Samples each reward rank scores at once (threads): code tests share the sandbox pool, judge and "
        "reward-model "
        "requests are in flight together; the ranks themselves are cluster.reward_workers_per_node x "
        "cluster.cpu_nodes.",
    )
    clip_min: float = Field(-10.0, description="Totals below this are clipped and flagged (out-of-range reward).")
    clip_max: float = Field(10.0, description="Totals above this are clipped and flagged (out-of-range reward).")
    math_timeout_s: float = Field(
        5.0, gt=0, description="Deadline of one math-verify call (our own; its signal timeout is disabled)."
    )
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="Code sandbox settings.")
    judge: JudgeConfig = Field(default_factory=JudgeConfig, description="LLM-as-judge settings.")
    reward_model: RewardModelConfig = Field(
        default_factory=RewardModelConfig, description="Sequence-classification reward model settings."
    )
    server: RewardServerConfig = Field(
        default_factory=RewardServerConfig, description="The servers of the judge and reward model."
    )

    @property
    def served_models(self) -> tuple[str, ...]:
        """The frozen models the rubric needs served ("judge", "reward_model"), in that order."""
        used = {f.name for f in self.functions}
        return tuple(name for name in ("judge", "reward_model") if name in used)

    @property
    def reads_completion_ids(self) -> bool:
        """Whether a function of the rubric reads token ids (READS_COMPLETION_IDS): they travel to the reward ranks."""
        return any(f.name in READS_COMPLETION_IDS for f in self.functions)

    @model_validator(mode="after")
    def _check_served_models(self) -> RewardConfig:
        if "judge" in self.served_models and not self.judge.model:
            raise ValueError(
                "reward.functions names judge but reward.judge.model is null: set it to the judge's HF checkpoint "
                f"directory, or {POLICY_MODEL!r} to judge with the run's initial policy"
            )
        if "reward_model" in self.served_models and not self.reward_model.path:
            raise ValueError(
                "reward.functions names reward_model but reward.reward_model.path is null: set it to a sequence-"
                f"classification HF checkpoint directory, or {POLICY_MODEL!r} for the initial policy with a fresh head"
            )
        template = self.judge.template
        if template is not None and not all(f"{{{name}}}" in template for name in ("response", "nonce")):
            raise ValueError(
                "reward.judge.template must contain {response} and {nonce} (the response fenced between markers "
                "holding "
                "the per-request nonce)"
            )
        if template is not None:
            try:
                template.format(rubric="", prompt="", response="", nonce="", lo=0.0, hi=1.0)
            except (KeyError, IndexError, ValueError) as error:
                raise ValueError(
                    f"reward.judge.template does not format ({error!r}): its only placeholders are "
                    "{rubric} {prompt} {response} {nonce} {lo} {hi}; write a literal brace as {{ or }}"
                ) from None
        judge = self.judge
        if judge.scoring == "expected" and not (
            0 <= judge.min_score < judge.max_score <= 9
            and judge.min_score == int(judge.min_score)
            and judge.max_score == int(judge.max_score)
        ):
            raise ValueError(
                f"reward.judge.scoring=expected reads the score from ONE next token, so the scale must be single "
                f"digits: "
                f"integers with 0 <= min_score < max_score <= 9 (got {judge.min_score:g}..{judge.max_score:g}; many "
                "tokenizers write 10 as '1', '0')"
            )
        if self.judge.max_score <= self.judge.min_score:
            raise ValueError(
                f"reward.judge.max_score={self.judge.max_score:g} must exceed "
                f"reward.judge.min_score={self.judge.min_score:g}"
            )
        return self
