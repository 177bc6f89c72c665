"""The one list of metric names a run emits; everything else (sinks, guards, docs) refers to it.

Names are stable across releases: dashboards, alerts and the plots of ``python -m hetrl.plot``
key on them. A name is either fixed (``reward/mean``) or a template whose ``<placeholder>`` parts
are filled at run time (``reward/<source>/mean`` with the reward source's name). Code should build
names through the constants and helper functions below, never by hand, so a typo cannot create a
metric nobody watches; :func:`check_name` rejects anything not listed here (with a did-you-mean).

docs/metrics.md explains every entry of :data:`METRICS`; a test keeps the two in sync.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

#: Statistics reported for every reward series (total, per source, per task).
REWARD_STATS = ("mean", "std", "min", "max")
#: Phases of the per-step wall-time breakdown.
TIME_PHASES = ("generate", "reward", "train", "weight_sync", "wait")

# A placeholder part (source, task, role, flag names) is one path segment of word characters,
# dots or dashes; `@` and `/` are reserved for the name structure.
_SEGMENT = r"[A-Za-z0-9_.\-]+"


@dataclass(frozen=True)
class MetricSpec:
    """One documented metric: its name (or template), what it means, its unit, who emits it."""

    name: str
    description: str
    unit: str
    emitted_by: str

    @property
    def is_template(self) -> bool:
        return "<" in self.name

    def pattern(self) -> re.Pattern[str]:
        """Regex matching concrete names of this spec (``<k>`` matches an integer)."""
        parts = re.split(r"(<[a-z_]+>)", self.name)
        regex = "".join((r"[0-9]+" if p == "<k>" else _SEGMENT) if p.startswith("<") else re.escape(p) for p in parts)
        return re.compile(f"^{regex}$")


METRICS: list[MetricSpec] = []


def _spec(name: str, description: str, unit: str = "", emitted_by: str = "loop") -> str:
    METRICS.append(MetricSpec(name, description, unit, emitted_by))
    return name


# --- rewards (computed from finished samples, see hetrl.monitor.metrics.rollout_metrics) ---
for _stat in REWARD_STATS:
    _spec(f"reward/{_stat}", f"{_stat} over the step's samples of the weighted total reward used for advantages.")
REWARD_MEAN = "reward/mean"
REWARD_STD = "reward/std"
for _stat in REWARD_STATS:
    _spec(
        f"reward/<source>/{_stat}",
        f"{_stat} of one reward source's raw score (before weighting) over the step's samples.",
    )
for _stat in REWARD_STATS:
    _spec(f"reward/task/<task>/{_stat}", f"{_stat} of the total reward over the step's samples of one task.")

# --- lengths and episodes ---
RESPONSE_LENGTH_MEAN = _spec(
    "response_length/mean", "Mean completion length (all completion tokens, incl. environment turns).", "tokens"
)
RESPONSE_LENGTH_MAX = _spec("response_length/max", "Longest completion of the step.", "tokens")
RESPONSE_LENGTH_TRUNCATED_FRAC = _spec(
    "response_length/truncated_frac", "Fraction of samples that hit max_tokens (finish_reason 'length').", "fraction"
)
EPISODE_TURNS_MEAN = _spec("episode/turns_mean", "Mean number of policy turns per episode.", "turns")
EPISODE_TOOL_CALLS_MEAN = _spec("episode/tool_calls_mean", "Mean number of tool calls per episode.", "calls")
EPISODE_ENV_WAIT_MEAN = _spec(
    "episode/env_wait_s_mean",
    "Mean seconds an episode waited for an environment slot on its rollout rank (env.concurrency; 0 without a bound).",
    "s",
)
FLAGS_FRAC = _spec("flags/frac", "Fraction of samples carrying at least one reward-hacking/sanity flag.", "fraction")
_spec("flags/<flag>_frac", "Fraction of samples carrying this flag.", "fraction")

# --- served reward models (per-sample values a reward function reports, averaged over the step's samples that have one)
# ---
JUDGE_FAILED_FRAC = _spec(
    "judge/failed_frac",
    "Fraction of judged samples for which the judge gave no verdict on any try (reward.judge.default_score was used).",
    "fraction",
)
JUDGE_SCORE_MASS = _spec(
    "judge/score_mass",
    "reward.judge.scoring=expected: mean probability the judge put on the scale's integers "
    "as its next token (near 0: the judge is not answering the question asked).",
    "fraction",
)
REWARD_UNAVAILABLE_FRAC = _spec(
    "reward/unavailable_frac",
    "Fraction of the step's samples scored 0 because a served judge or reward model never answered "
    "(reward.server.max_attempts tries; flagged reward/unavailable:<source>, never scored again).",
    "fraction",
)
ENV_UNSCORED_FRAC = _spec(
    "env/unscored_frac",
    "reward source env: fraction of episodes their environment returned no verdict for "
    "(scored 0, flagged reward/env_unscored).",
    "fraction",
)
HACK_PROXY_CORR = _spec(
    "hack/proxy_corr",
    "Pearson correlation over the step's samples between the learned rewards (sources judge, reward_model) and "
    "the verifiable ones (math, code), when a step has both; falling to 0 or below while the learned reward rises: "
    "the policy "
    "pleases the model, not the task.",
    "correlation",
)

# --- trainer ---
ADVANTAGE_MEAN = _spec(
    "advantage/mean",
    "Mean advantage over policy tokens (about 0 for group-normalised estimators).",
    emitted_by="trainer",
)
ADVANTAGE_STD = _spec(
    "advantage/std", "Std of advantages over policy tokens; 0 means no learning signal.", emitted_by="trainer"
)
REWARD_SHAPED_MEAN = _spec(
    "reward/shaped_mean",
    "Mean over the step's samples of the reward the trainer computed advantages from: reward/mean after the "
    "algorithm's shaping (DAPO's overlong punishment, the KL penalty of algorithm.kl_in_reward), summed over tokens.",
    emitted_by="trainer",
)
REWARD_KL_PENALTY = _spec(
    "reward/kl_penalty",
    "algorithm.kl_in_reward: mean over the step's samples of what the KL to the reference model took from a "
    "response's reward, kl_coef times the sum of its tokens' KL estimates (0 while the policy is its reference).",
    emitted_by="trainer",
)
LOSS_POLICY = _spec("loss/policy", "Policy-gradient (clipped surrogate) part of the loss.", emitted_by="trainer")
LOSS_KL = _spec("loss/kl", "KL(policy || reference) penalty part of the loss, before kl_coef.", emitted_by="trainer")
LOSS_ENTROPY = _spec("loss/entropy", "Entropy-bonus part of the loss, before entropy_coef.", emitted_by="trainer")
LOSS_VALUE = _spec("loss/value", "Value-function loss (ppo only).", emitted_by="trainer")
LOSS_TOTAL = _spec("loss/total", "The optimised loss: sum of the weighted parts.", emitted_by="trainer")
CLIP_FRAC_LOW = _spec(
    "clip_frac/low",
    "Fraction of policy tokens whose ratio was clipped below 1 - clip_low (negative advantage).",
    "fraction",
    "trainer",
)
CLIP_FRAC_HIGH = _spec(
    "clip_frac/high",
    "Fraction of policy tokens whose ratio was clipped above 1 + clip_high (positive advantage).",
    "fraction",
    "trainer",
)
APPROX_KL = _spec(
    "approx_kl", "k3 estimate of KL(policy || reference model) on the step's policy tokens.", "nats", "trainer"
)
POLICY_KL = _spec(
    "policy_kl",
    "k3 estimate of KL(behaviour policy || updated policy): how far the step's updates moved the policy.",
    "nats",
    "trainer",
)
ENTROPY = _spec("entropy", "Mean per-token entropy of the policy over policy tokens.", "nats", "trainer")
GRAD_NORM = _spec("grad_norm", "Global gradient norm before clipping.", emitted_by="trainer")
LEARNING_RATE = _spec("lr", "Learning rate used at this step.", emitted_by="trainer")
CLIP_FRAC_DUAL = _spec(
    "clip_frac/dual",
    "Fraction of policy tokens where the dual-clip bound (negative advantage, ratio > c) was active.",
    "fraction",
    "trainer",
)
VALUE_CLIP_FRAC = _spec(
    "value/clip_frac", "PPO: fraction of tokens whose value prediction was clipped.", "fraction", "trainer"
)
VALUE_MEAN = _spec(
    "value/mean", "PPO: mean value-model prediction over policy tokens during its update.", "", "trainer"
)
CRITIC_GRAD_NORM = _spec(
    "critic/grad_norm", "PPO: the value model's global gradient norm before clipping.", "", "trainer"
)
CRITIC_LEARNING_RATE = _spec(
    "critic/lr", "PPO: the value model's learning rate at this step (critic.lr and its schedule).", "", "trainer"
)
CRITIC_STEP_S = _spec("critic/step_s", "PPO: wall time of the value model's optimizer step.", "s", "trainer")
IS_WEIGHT_MEAN = _spec(
    "is/weight_mean",
    "Mean importance weight of the train/inference mismatch correction (trainer vs engine probability).",
    "",
    "trainer",
)
IS_MASKED_FRAC = _spec(
    "is/masked_frac",
    "Fraction of policy tokens rejected by masked IS or IcePop (weight outside [is_threshold_low, is_threshold]).",
    "fraction",
    "trainer",
)
IS_TRUNCATED_FRAC = _spec(
    "is/truncated_frac",
    "Fraction of policy tokens whose IS weight was truncated at the threshold.",
    "fraction",
    "trainer",
)
TRAINER_TOKENS_PER_S = _spec(
    "perf/trainer_tokens_per_s",
    "Tokens trained per second (prompt + completion, all DP ranks) in the optimizer step.",
    "tokens/s",
    "trainer",
)
TRAIN_STEP_S = _spec(
    "perf/train_step_s", "Wall time of the trainer's optimizer step (log-prob passes included).", "s", "trainer"
)

# --- train/inference mismatch (hetrl.monitor.mismatch) ---
MISMATCH_PROB_RATIO_MEAN = _spec(
    "mismatch/prob_ratio_mean",
    "Mean per-token ratio pi_trainer/pi_engine of the sampled tokens; 1 when the two agree.",
    emitted_by="trainer",
)
MISMATCH_K3_KL = _spec(
    "mismatch/k3_kl", "k3 estimate of KL(pi_engine || pi_trainer) per policy token.", "nats", "trainer"
)
MISMATCH_MAX_ABS_LOGPROB_DIFF = _spec(
    "mismatch/max_abs_logprob_diff",
    "Largest abs(log pi_trainer - log pi_engine) over the step's policy tokens.",
    "nats",
    "trainer",
)
ROUTING_DISAGREE_FRAC = _spec(
    "routing/disagree_frac",
    "MoE runs with rollout.return_routing or routing_replay: fraction of (token, layer) pairs whose "
    "experts as the trainer's router computes them differ from those the engine routed to (with routing_replay the "
    "engine's are used all the same).",
    "fraction",
    "trainer",
)

# --- off-policy staleness ---
STALENESS_MEAN = _spec(
    "staleness/mean", "Mean policy lag (trainer version - oldest token version) of trained samples.", "versions"
)
STALENESS_MAX = _spec("staleness/max", "Largest policy lag among trained samples.", "versions")
STALENESS_DROPPED = _spec(
    "staleness/dropped", "Samples dropped this step for exceeding the staleness bound.", "samples"
)
STALENESS_BOUND = _spec(
    "staleness/bound",
    "The staleness bound this step's batch was held to: 0 (sync), schedule.max_staleness, or the adaptive "
    "bound of schedule.adaptive_staleness, which floats between its min_staleness and max_staleness.",
    "versions",
)
STALENESS_REGENERATED = _spec(
    "staleness/regenerated",
    "Samples generated again this step for exceeding the staleness bound "
    "(schedule.stale_policy=regenerate): same sample ids, task and seeds, by the current policy.",
    "samples",
)
WEIGHT_SYNC_REFUSED = _spec(
    "weight_sync/refused_pushes",
    "Weight pushes refused since the previous step, counted per engine and refusal (one resend "
    "answers every engine's refusal of a send, and none follows one superseded by a newer step's push); the engine "
    "served its "
    "old version meanwhile, so its samples may have been dropped as stale.",
    "pushes",
)
DYNAMIC_SAMPLING_DROPPED = _spec(
    "dynamic_sampling/dropped_groups",
    "Groups dropped this step by DAPO dynamic sampling (all rewards equal) and refilled.",
    "groups",
)

# --- throughput and time ---
_spec(
    "throughput/<role>_tokens_per_s",
    "Tokens processed per second by one role (generated, scored or trained).",
    "tokens/s",
    "any role",
)
_TIME_PHASE_SPECS = {
    "generate": (
        "Orchestrator wall time from the step's start until its batch was complete (generation and scoring, "
        "or only what was left of them under an overlapping schedule).",
        "loop",
    ),
    "reward": (
        "Reward workers' scoring time of the step's trained samples (summed over workers, so it can exceed "
        "time/generate, which it overlaps).",
        "reward",
    ),
    "train": ("Orchestrator wall time from sending the batch to the trainer until the new version came back.", "loop"),
    "weight_sync": (
        "Trainer rank 0's wall time pushing the latest weights to the engines: the push that followed the "
        "previous step (or restore), which this step's generation waited for under sync.",
        "trainer",
    ),
    "wait": (
        "Trainer rank 0's idle time waiting for work since its previous answer: the trainer's share of the "
        "step spent waiting for a batch.",
        "trainer",
    ),
}
for _phase in TIME_PHASES:
    _spec(f"time/{_phase}", _TIME_PHASE_SPECS[_phase][0], "s", _TIME_PHASE_SPECS[_phase][1])
TIME_STEP = _spec("time/step", "Wall time of the whole step.", "s")
PERF_MFU = _spec(
    "perf/mfu",
    "Model FLOPs utilisation of the trainer: model FLOPs (6 x active weights per token + causal attention) of "
    "the trained tokens per second, over the bf16 dense peak of its GPUs (hetrl.monitor.mfu); bf16 on known GPUs only.",
    "fraction",
    "trainer",
)

# --- evaluation (hetrl.monitor.eval) ---
_spec("eval/<task>/pass@<k>", "Unbiased pass@k (Chen et al. 2021) on held-out prompts of one task.", "fraction", "eval")
_spec(
    "eval/<task>/mean@<k>", "Mean reward over k samples per held-out prompt, averaged over prompts.", emitted_by="eval"
)


def segment(value: str) -> str:
    """A free-form name (a task source such as ``reasoning_gym/basic_arithmetic``, a flag such as
    ``hack/exit_early``) as one metric-path segment: every other character becomes ``.``."""
    return re.sub(r"[^A-Za-z0-9_.\-]", ".", value) or "_"


def _check_segment(kind: str, value: str) -> str:
    if not re.fullmatch(_SEGMENT, value):
        raise ValueError(
            f"{kind} name {value!r} must be word characters, dots or dashes (it becomes one metric-path segment)"
        )
    return value


def reward_source(source: str, stat: str = "mean") -> str:
    """``reward/<source>/<stat>``; ``task`` is reserved for the per-task family."""
    if source == "task":
        raise ValueError("reward source may not be named 'task' (reserved for reward/task/<task>/...)")
    if stat not in REWARD_STATS:
        raise ValueError(f"reward stat must be one of {REWARD_STATS}, got {stat!r}")
    return f"reward/{_check_segment('reward source', source)}/{stat}"


def reward_task(task: str, stat: str = "mean") -> str:
    """``reward/task/<task>/<stat>``."""
    if stat not in REWARD_STATS:
        raise ValueError(f"reward stat must be one of {REWARD_STATS}, got {stat!r}")
    return f"reward/task/{_check_segment('task', task)}/{stat}"


def flag_frac(flag: str) -> str:
    """``flags/<flag>_frac``."""
    return f"flags/{_check_segment('flag', flag)}_frac"


def throughput(role: str) -> str:
    """``throughput/<role>_tokens_per_s``."""
    return f"throughput/{_check_segment('role', role)}_tokens_per_s"


def time_phase(phase: str) -> str:
    """``time/<phase>`` for one of :data:`TIME_PHASES`."""
    if phase not in TIME_PHASES:
        raise ValueError(f"time phase must be one of {TIME_PHASES}, got {phase!r}")
    return f"time/{phase}"


def eval_pass_at(task: str, k: int) -> str:
    """``eval/<task>/pass@<k>``."""
    return f"eval/{_check_segment('task', task)}/pass@{int(k)}"


def eval_mean_at(task: str, k: int) -> str:
    """``eval/<task>/mean@<k>``."""
    return f"eval/{_check_segment('task', task)}/mean@{int(k)}"


_FIXED = {s.name for s in METRICS if not s.is_template}
_PATTERNS = [(s, s.pattern()) for s in METRICS if s.is_template]


def spec_of(name: str) -> MetricSpec | None:
    """The spec a concrete metric name belongs to, or None if it is not a documented name."""
    for spec in METRICS:
        if spec.name == name:
            return spec
    for spec, pattern in _PATTERNS:
        if pattern.match(name):
            return spec
    return None


def check_name(name: str) -> str:
    """Return ``name`` if documented, else raise ValueError naming the closest documented names."""
    if name in _FIXED or spec_of(name) is not None:
        return name
    close = difflib.get_close_matches(name, [s.name for s in METRICS], n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ValueError(f"unknown metric name {name!r}: add it to hetrl/monitor/names.py and docs/metrics.md{hint}")
