"""Metric names: one registry, validated, and docs/metrics.md documents exactly it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hetrl.monitor import names

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_doc_lists_every_metric_and_only_those():
    text = DOC.read_text(encoding="utf-8")
    table_names = set(re.findall(r"^\| `([^`]+)` \|", text, flags=re.M))
    registry = {s.name for s in names.METRICS}
    assert registry - table_names == set(), "metrics missing from docs/metrics.md"
    assert table_names - registry == set(), "docs/metrics.md lists metrics that names.py does not define"


def test_registry_unique_and_described():
    all_names = [s.name for s in names.METRICS]
    assert len(all_names) == len(set(all_names))
    assert all(s.description for s in names.METRICS)


@pytest.mark.parametrize(
    "name",
    [
        "reward/mean",
        "reward/math_verify/std",
        "reward/task/gsm8k/max",
        "flags/format_violation_frac",
        "throughput/trainer_tokens_per_s",
        "time/weight_sync",
        "eval/countdown/pass@8",
        "eval/countdown/mean@1",
        "perf/mfu",
    ],
)
def test_known_names_accepted(name):
    assert names.check_name(name) == name


@pytest.mark.parametrize(
    "name", ["reward/mean/extra", "reward", "eval/x/pass@k", "throughput/trainer", "time/sleep", "loss"]
)
def test_unknown_names_rejected(name):
    with pytest.raises(ValueError, match="unknown metric"):
        names.check_name(name)


def test_helpers_build_valid_names():
    assert names.reward_source("format", "min") == "reward/format/min"
    assert names.reward_task("gsm8k") == "reward/task/gsm8k/mean"
    assert names.throughput("reward") == "throughput/reward_tokens_per_s"
    assert names.eval_pass_at("gsm8k", 4) == "eval/gsm8k/pass@4"
    with pytest.raises(ValueError, match="reserved"):
        names.reward_source("task")
    with pytest.raises(ValueError, match="one metric-path segment"):
        names.reward_task("a/b")
    with pytest.raises(ValueError, match="time phase"):
        names.time_phase("nap")
