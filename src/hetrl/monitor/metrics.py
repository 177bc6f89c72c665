"""Per-step metrics computed from finished samples, so every loop reports them the same way.

The trainer's own numbers (losses, clip fractions, entropy, grad norm) come from the trainer; what
can be derived from :class:`hetrl.records.SampleMeta` records alone lives here: reward statistics in
total, per reward source and per task, lengths and truncation, turns and tool calls, flag rates,
policy staleness, and MFU from a token rate.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from hetrl.monitor import names
from hetrl.records import ENV_WAIT_KEY, REWARD_METRICS_KEY, SampleMeta


def _stats(values: Sequence[float], name_of) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    return {
        name_of("mean"): float(arr.mean()),
        name_of("std"): float(arr.std()),
        name_of("min"): float(arr.min()),
        name_of("max"): float(arr.max()),
    }


def reward_metrics(samples: Sequence[SampleMeta]) -> dict[str, float]:
    """``reward/*`` in total, per source (raw, unweighted) and per task; {} for no samples."""
    if not samples:
        return {}
    out = _stats([s.reward for s in samples], lambda stat: f"reward/{stat}")
    by_source: dict[str, list[float]] = defaultdict(list)
    by_task: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        for source, value in s.rewards.items():
            by_source[source].append(value)
        by_task[s.task_name].append(s.reward)
    for source, values in sorted(by_source.items()):
        out.update(_stats(values, lambda stat, src=source: names.reward_source(names.segment(src), stat)))
    for task, values in sorted(by_task.items()):
        out.update(_stats(values, lambda stat, t=task: names.reward_task(names.segment(t), stat)))
    return out


def rollout_metrics(samples: Sequence[SampleMeta]) -> dict[str, float]:
    """Reward, length, truncation, episode and flag metrics of one step's samples."""
    if not samples:
        return {}
    lengths = np.array([s.completion_len for s in samples], dtype=np.float64)
    out = reward_metrics(samples)
    out[names.RESPONSE_LENGTH_MEAN] = float(lengths.mean())
    out[names.RESPONSE_LENGTH_MAX] = float(lengths.max())
    out[names.RESPONSE_LENGTH_TRUNCATED_FRAC] = sum(s.finish_reason == "length" for s in samples) / len(samples)
    out[names.EPISODE_TURNS_MEAN] = float(np.mean([s.num_turns for s in samples]))
    out[names.EPISODE_TOOL_CALLS_MEAN] = float(np.mean([s.num_tool_calls for s in samples]))
    out[names.EPISODE_ENV_WAIT_MEAN] = float(np.mean([s.info.get(ENV_WAIT_KEY, 0.0) for s in samples]))
    out[names.FLAGS_FRAC] = sum(bool(s.flags) for s in samples) / len(samples)
    flag_counts: dict[str, int] = defaultdict(int)
    for s in samples:
        for flag in set(s.flags):
            flag_counts[flag] += 1
    for flag, count in sorted(flag_counts.items()):
        out[names.flag_frac(names.segment(flag))] = count / len(samples)
    out.update(reward_function_metrics(samples))
    correlation = proxy_correlation(samples)
    if correlation is not None:
        out[names.HACK_PROXY_CORR] = correlation
    return out


def reward_function_metrics(samples: Sequence[SampleMeta]) -> dict[str, float]:
    """The step's mean of each documented per-sample metric the reward functions reported
    (``SampleMeta.info["reward_metrics"]``, e.g. ``judge/failed_frac``), over the samples that carry it."""
    values: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        for name, value in s.info.get(REWARD_METRICS_KEY, {}).items():
            if names.spec_of(name) is not None:  # the rubric's own bookkeeping stays out of the step's metrics
                values[name].append(value)
    return {name: float(np.mean(vals)) for name, vals in sorted(values.items())}


LEARNED_SOURCES = ("judge", "reward_model")
VERIFIABLE_SOURCES = ("math", "code")


def proxy_correlation(samples: Sequence[SampleMeta]) -> float | None:
    """Pearson correlation of the learned and the verifiable reward sources' sums (``hack/proxy_corr``).

    None unless every sample carries both kinds and both vary over the step (a correlation needs spread).
    """
    learned, verifiable = [], []
    for s in samples:
        lv = [s.rewards[k] for k in LEARNED_SOURCES if k in s.rewards]
        vv = [s.rewards[k] for k in VERIFIABLE_SOURCES if k in s.rewards]
        if not lv or not vv:
            return None
        learned.append(sum(lv))
        verifiable.append(sum(vv))
    if len(samples) < 2 or np.std(learned) == 0 or np.std(verifiable) == 0:
        return None
    return float(np.corrcoef(learned, verifiable)[0, 1])


def staleness_metrics(samples: Iterable[SampleMeta], trainer_version: int, num_dropped: int = 0) -> dict[str, float]:
    """Policy lag of the samples a trainer step consumes.

    The lag of a sample is ``trainer_version - sample.min_version`` (its oldest policy token
    decides how off-policy it is); samples without policy tokens are skipped.
    """
    lags = [trainer_version - s.min_version for s in samples if s.min_version >= 0]
    out = {names.STALENESS_DROPPED: float(num_dropped)}
    if lags:
        out[names.STALENESS_MEAN] = float(np.mean(lags))
        out[names.STALENESS_MAX] = float(max(lags))
    return out


def mfu(tokens_per_s: float, num_params: int, peak_flops_per_device: float, num_devices: int) -> float:
    """Model FLOPs utilisation with the standard ``6 * N`` FLOPs per trained token.

    Forward + backward of a dense transformer costs about ``6 * num_params`` FLOPs per token
    (attention's sequence-length term is left out, as in the PaLM paper's headline MFU), so this
    slightly under-reports at long context. ``peak_flops_per_device`` is the datasheet dense peak
    for the dtype in use (e.g. ~989e12 for H100 bf16).
    """
    if peak_flops_per_device <= 0 or num_devices <= 0:
        raise ValueError(
            f"peak_flops_per_device and num_devices must be positive, got {peak_flops_per_device}, {num_devices}"
        )
    return 6.0 * num_params * tokens_per_s / (peak_flops_per_device * num_devices)
