"""What the run viewer shows, read from a run directory that it never writes to.

Every reader here opens files read-only and returns JSON-ready dicts. The run may be going (its
files grow under us), partial (a run that crashed before writing its summary) or from an older
release: a part that cannot be read becomes a line in the answer's ``"missing"`` list, which the
page shows, never an exception that would reach the browser as a stack trace.

Cost. A page reads only what it shows: the metrics page asks for the lines of ``metrics.jsonl``
after the byte offset it already has; the rollouts page reads the store's step column, then one
step's rows, then the samples it opens (:class:`hetrl.monitor.rollout_store.RolloutReader` reads
windows of rows, never the whole store).
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from hetrl.config.algorithm import AlgorithmConfig
from hetrl.control import rundir, timeline
from hetrl.control.plan import Plan
from hetrl.monitor.mismatch import token_log_ratio
from hetrl.monitor.rollout_store import RolloutReader, RolloutRecord, RolloutRow, select_rows
from hetrl.monitor.sinks import METRICS_FILE

ALERTS_FILE = "alerts.jsonl"

# The metric families of docs/metrics.md, in the order the metrics page draws them: a family takes
# a metric whose name starts with one of its prefixes ("x/") or is one of its names ("entropy").
FAMILIES: dict[str, tuple[str, ...]] = {
    "reward": ("reward/", "flags/", "judge/", "hack/", "env/", "advantage/"),
    "lengths": ("response_length/", "episode/"),
    "policy": (
        "loss/",
        "clip_frac/",
        "approx_kl",
        "policy_kl",
        "entropy",
        "grad_norm",
        "lr",
        "is/",
        "value/",
        "critic/",
    ),
    "mismatch": ("mismatch/",),
    "staleness": ("staleness/", "weight_sync/", "dynamic_sampling/"),
    "throughput": ("throughput/", "perf/"),
    "time": ("time/",),
    "routing": ("routing/",),
    "eval": ("eval/",),
}
OTHER_FAMILY = "other"  # a name no family claims (none of the documented ones; a test keeps it so)


def family_of(name: str) -> str:
    """The family a metric is drawn in (:data:`FAMILIES`), or :data:`OTHER_FAMILY`."""
    for family, prefixes in FAMILIES.items():
        if any(name.startswith(p) if p.endswith("/") else name == p for p in prefixes):
            return family
    return OTHER_FAMILY


def _guarded(missing: list[str], what: str, read: Callable[[], Any]) -> Any:
    """``read()``, or None with a line in ``missing`` when the file is absent, cut short or of another format."""
    try:
        return read()
    except FileNotFoundError:
        missing.append(f"{what}: not written (yet)")
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as err:
        missing.append(f"{what}: unreadable ({type(err).__name__}: {err})")
    return None


def _jsonl(path: Path) -> list[dict]:
    """The complete JSON lines of a file (a line being written, or cut by a crash, is left out)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _plan(run: Path) -> dict:
    plan = Plan.from_json((run / rundir.PLAN).read_text())
    return {
        "nodes": plan.nodes,
        "gpus_per_node": plan.gpus_per_node,
        "roles": plan.role_sizes(),
        "ranks": [
            {
                "world_rank": a.world_rank,
                "role": f"{a.role}_{a.role_rank}",
                "component": a.component,
                "node": a.node,
                "gpus": list(a.gpus),
            }
            for a in plan.assignments
        ],
    }


def _health(run: Path) -> list[dict]:
    """Each rank's liveness beat (hetrl.control.liveness) with the seconds since it beat and progressed."""
    beats = sorted((rundir.hang_dir(run) / "beats").glob("rank_*.json"), key=lambda p: int(p.stem.split("_")[1]))
    if not beats:
        raise FileNotFoundError("no beats")
    now, out = time.time(), []
    for path in beats:
        try:
            beat = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue  # caught mid-write by its beacon
        out.append(
            {
                "rank": beat.get("rank"),
                "role": f"{beat.get('role')}_{beat.get('role_rank')}",
                "host": beat.get("host"),
                "state": beat.get("state"),
                "activity": beat.get("activity"),
                "beat_age_s": round(now - float(beat.get("beat", now)), 1),
                "progress_age_s": round(now - float(beat.get("progress", now)), 1),
            }
        )
    return out


def overview(run: Path) -> dict:
    """The Overview page: resolved recipe, plan, summary and eval results, alerts, role health, hang report."""
    missing: list[str] = []
    return {
        "run": str(run),
        "config": _guarded(missing, rundir.CONFIG, lambda: (run / rundir.CONFIG).read_text()),
        "plan": _guarded(missing, rundir.PLAN, lambda: _plan(run)),
        "summary": _guarded(missing, rundir.SUMMARY, lambda: json.loads((run / rundir.SUMMARY).read_text())),
        "alerts": _guarded(missing, ALERTS_FILE, lambda: _jsonl(run / ALERTS_FILE)) or [],
        "health": _guarded(missing, "role health (hang/beats)", lambda: _health(run)) or [],
        "hang_report": (run / rundir.HANG / "report.txt").read_text()
        if (run / rundir.HANG / "report.txt").is_file()
        else None,
        "missing": missing,
    }


def _finite(value: Any) -> float | None:
    """A metric value as a number, or None (a chart's gap) for the sink's "nan"/"inf" strings."""
    value = float(value)
    return value if math.isfinite(value) else None


def metrics_since(run: Path, offset: int = 0) -> dict:
    """The metrics lines after byte ``offset`` of ``metrics.jsonl``, and the offset to ask from next.

    A line still being written (no newline yet) is left for the next call, so a page polling a
    live run sees every step exactly once. Rows keep the sink's shape (``step`` plus values);
    ``families`` names each metric's family (:func:`family_of`)."""
    path = run / METRICS_FILE
    if not path.is_file():
        return {"offset": 0, "rows": [], "families": {}, "missing": [f"{METRICS_FILE}: not written (yet)"]}
    with path.open("rb") as fh:
        if offset > path.stat().st_size:
            offset = 0  # the file was replaced by a shorter one: start over
        fh.seek(offset)
        data = fh.read()
    complete = data[: data.rfind(b"\n") + 1]
    rows, skipped = [], 0
    for line in complete.decode("utf-8", errors="replace").splitlines():
        try:
            raw = json.loads(line)
            rows.append(
                {"step": int(raw["step"]), **{k: _finite(v) for k, v in raw.items() if k not in ("step", "time")}}
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            skipped += 1
    names = sorted({k for row in rows for k in row if k != "step"})
    return {
        "offset": offset + len(complete),
        "rows": rows,
        "families": {name: family_of(name) for name in names},
        "missing": [f"{METRICS_FILE}: {skipped} unreadable line(s) left out"] if skipped else [],
    }


def _reader(run: Path) -> RolloutReader:
    reader = RolloutReader(run)
    if not reader.files():
        raise FileNotFoundError(f"no rollout files in {reader.directory}")
    return reader


def _store_error(err: Exception) -> str:
    if isinstance(err, FileNotFoundError):
        return f"rollouts: {err} (monitor.rollout_store.enabled=false, or no step has finished yet)"
    return f"rollouts: the store cannot be read ({type(err).__name__}: {err}); an older or damaged format?"


STORE_ERRORS = (FileNotFoundError, OSError, KeyError, ValueError, UnicodeDecodeError)
_PREVIEW_CHARS = 400  # of each completion drawn in a group's side-by-side view


def rollout_steps(run: Path) -> dict:
    """The RL steps with stored rollouts and how many each holds (the store's step column only)."""
    try:
        return {"steps": _reader(run).step_counts(), "missing": []}
    except STORE_ERRORS as err:
        return {"steps": {}, "missing": [_store_error(err)]}


def _row_json(row: RolloutRow) -> dict:
    return {
        "sample_id": row.sample_id,
        "task": row.task_name,
        "reward": row.reward,
        "length": row.length,
        "flags": row.flags,
        "finish": row.finish_reason,
    }


@functools.lru_cache(maxsize=4)
def _parsed_config(path: Path, mtime_ns: int) -> dict:
    # libyaml's parser when PyYAML has it: the pure-Python one took 1.5 s for tiny_grpo's config on a busy machine
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}


def run_config(run: Path) -> dict:
    """The run's resolved config.yaml as plain data (parsed once per version of the file); {} when unreadable."""
    path = run / rundir.CONFIG
    try:
        config = _parsed_config(path, path.stat().st_mtime_ns)
    except (OSError, yaml.YAMLError):
        return {}
    return config if isinstance(config, dict) else {}


def advantage_estimator(run: Path) -> str | None:
    """The run's advantage estimator (``algorithm.resolved_advantage`` of its config.yaml), or None."""
    try:
        return AlgorithmConfig.model_validate(run_config(run)["algorithm"]).resolved_advantage
    except (KeyError, TypeError, ValueError):
        return None


def import_advantages() -> None:
    """Import what :func:`group_advantages` needs (torch: seconds on a busy machine), so that the server
    can do it in the background at start instead of in the first step a user opens."""
    # lazy: torch, which the rest of the viewer never needs
    from hetrl.trainer import advantages  # noqa: F401


def group_advantages(rows: list[RolloutRow], estimator: str | None) -> dict[str, float | None]:
    """Each sample's advantage as the trainer forms it from the stored total rewards of its whole group
    (the group estimators grpo, grpo_no_std, rloo; before trainer-side shaping such as an overlong
    penalty). The token-level estimators (reinforce_pp, gae) need the batch or the value model: None."""
    if estimator not in ("grpo", "grpo_no_std", "rloo") or not rows:
        return {r.sample_id: None for r in rows}
    # lazy: torch (~1 s to import), only once a page shows a step's groups
    import torch

    from hetrl.trainer import advantages

    rewards, groups = torch.tensor([r.reward for r in rows], dtype=torch.float64), [r.group_id for r in rows]
    if estimator == "rloo":
        adv = advantages.rloo(rewards, groups)
    else:
        adv = advantages.group_normalized(rewards, groups, scale_by_std=estimator == "grpo")
    return {r.sample_id: float(a) for r, a in zip(rows, adv.tolist())}


def step_groups(run: Path, step: int, filters: dict[str, Any], num_groups: int = 20) -> dict:
    """One step's samples that pass ``filters`` (:func:`select_rows`'s keywords), by group, worst group first.

    Each sample comes with its advantage (:func:`group_advantages`, over its whole group, filtered or
    not) and, for the first ``num_groups`` groups only, the start of its completion: the page draws
    those side by side, and a step of 1,024 samples loads only what it shows."""
    try:
        reader = _reader(run)
        all_rows = reader.rows(step)
        rows = select_rows(all_rows, **filters)
    except STORE_ERRORS as err:
        return {"step": step, "groups": [], "tasks": [], "flags": [], "finishes": [], "missing": [_store_error(err)]}
    estimator = advantage_estimator(run)
    adv = group_advantages(all_rows, estimator)
    groups: dict[str, list[RolloutRow]] = {}
    for row in rows:
        groups.setdefault(row.group_id, []).append(row)
    ordered = sorted(groups.items(), key=lambda g: sum(r.reward for r in g[1]) / len(g[1]))
    shown = [r for _, members in ordered[:num_groups] for r in members]
    try:
        preview = {rec.sample.sample_id: rec.sample.completion_text[:_PREVIEW_CHARS] for rec in reader.load(shown)}
    except STORE_ERRORS as err:
        return {"step": step, "groups": [], "tasks": [], "flags": [], "finishes": [], "missing": [_store_error(err)]}
    return {
        "step": step,
        "num_samples": len(all_rows),
        "num_shown": len(rows),
        "num_groups": len(groups),
        "groups": [
            {
                "group_id": gid,
                "task": members[0].task_name,
                "mean_reward": sum(r.reward for r in members) / len(members),
                "samples": [
                    {**_row_json(r), "advantage": adv[r.sample_id], "preview": preview[r.sample_id]} for r in members
                ],
            }
            for gid, members in ordered[:num_groups]
        ],
        "tasks": sorted({r.task_name for r in all_rows}),
        "flags": sorted({f for r in all_rows for f in r.flags}),
        "finishes": sorted({r.finish_reason for r in all_rows}),
        "estimator": estimator,
        "missing": [],
    }


def sample_detail(run: Path, step: int, sample_id: str, pieces: Callable[[list[int]], list[str] | None]) -> dict:
    """One sample for the Rollouts page: its tokens (text pieces, loss mask, versions, engine and trainer
    log-probs and their gap), turns, rewards by source, flags, images (PNG bytes are served separately).

    ``pieces`` turns token ids into their text (the run's tokenizer; None: show the ids)."""
    try:
        reader = _reader(run)
        rows = [r for r in reader.rows(step) if r.sample_id == sample_id]
        if not rows:
            return {"missing": [f"rollouts: no sample {sample_id!r} in step {step}"]}
        (record,) = reader.load(rows[:1])
    except STORE_ERRORS as err:
        return {"missing": [_store_error(err)]}
    return {**record_view(record, pieces), "missing": []}


def record_view(record: RolloutRecord, pieces: Callable[[list[int]], list[str] | None]) -> dict:
    """A stored rollout as the page draws it (see :func:`sample_detail`)."""
    s = record.sample
    trainer = record.trainer_logprobs
    gap = token_log_ratio(s.logprobs, trainer).tolist() if trainer is not None else None
    texts = pieces(s.completion_ids)
    policy_versions = [v for v in s.versions if v >= 0]  # an observation token has none (-1)
    tokens = [
        {
            "id": tid,
            "text": texts[i] if texts is not None else f"[{tid}]",
            "mask": s.loss_mask[i],
            "version": s.versions[i],
            "engine_lp": s.logprobs[i],
            "trainer_lp": None if trainer is None else trainer[i],
            "gap": None if gap is None else gap[i],
        }
        for i, tid in enumerate(s.completion_ids)
    ]
    return {
        "step": record.step,
        "sample_id": s.sample_id,
        "group_id": s.group_id,
        "task": s.task_name,
        "prompt": s.prompt_text,
        "completion": s.completion_text,
        "tokens": tokens,
        "turns": turns(tokens),
        "tokenized": texts is not None,
        "reward": s.reward,
        "rewards": s.rewards,
        "flags": s.flags,
        "finish": s.finish_reason,
        "num_turns": s.num_turns,
        "num_tool_calls": s.num_tool_calls,
        "versions": [min(policy_versions, default=-1), max(policy_versions, default=-1)],
        "answer": s.answer,
        "info": s.info,
        "num_images": len(s.images),
    }


def turns(tokens: list[dict]) -> list[dict]:
    """A completion cut where its loss mask changes: the policy's turns (trained) and what the
    environment put between them (tool results, observations; not trained), in order."""
    out: list[dict] = []
    for i, token in enumerate(tokens):
        who = "policy" if token["mask"] else "environment"
        if not out or out[-1]["who"] != who:
            out.append({"who": who, "start": i, "end": i})
        out[-1]["end"] = i + 1
    return out


def sample_image(run: Path, step: int, sample_id: str, k: int) -> bytes | None:
    """The ``k``-th image of a sample as PNG bytes (the store keeps PNGs), or None."""
    try:
        reader = _reader(run)
        rows = [r for r in reader.rows(step) if r.sample_id == sample_id]
        images = reader.load(rows[:1])[0].sample.images if rows else []
    except STORE_ERRORS:
        return None
    return images[k] if 0 <= k < len(images) else None


def timeline_view(run: Path, steps: int) -> dict:
    """The last ``steps`` RL steps' spans and hops across ranks (times relative to the first step's
    start), and the per-phase medians ``python -m hetrl.plot`` prints."""
    missing: list[str] = []
    records = _guarded(missing, rundir.TIMELINE, lambda: timeline.read_timeline(run)) or []
    windows = sorted(timeline.step_windows(records).items())
    if not windows:
        missing.append(f"{rundir.TIMELINE}: no RL step recorded (monitor.timeline=false, or none finished yet)")
        return {"steps": [], "spans": [], "hops": [], "phases": {}, "hop_latencies": {}, "missing": missing}
    shown = windows[-steps:]
    start, end = shown[0][1][0], shown[-1][1][1]
    in_view = [r for r in records if r.t1 >= start and r.t0 <= end]
    who_of_rank = {}
    if (run / rundir.PLAN).is_file():
        plan = _guarded(missing, rundir.PLAN, lambda: _plan(run))
        who_of_rank = {r["world_rank"]: r["role"] for r in (plan or {}).get("ranks", [])}
    return {
        "steps": [{"step": s, "t0": a - start, "t1": b - start} for s, (a, b) in shown],
        "spans": [
            {"who": r.who, "name": r.name, "t0": r.t0 - start, "t1": r.t1 - start}
            for r in in_view
            if r.source is None and r.name != "step"
        ],
        "hops": [
            {"to": r.who, "from": who_of_rank.get(r.source), "name": r.name, "t0": r.t0 - start, "t1": r.t1 - start}
            for r in in_view
            if r.source is not None
        ],
        "phases": timeline.phase_medians(records) if len(windows) > 1 else {},
        "hop_latencies": {k: list(v) for k, v in timeline.hop_latencies(records).items()} if len(windows) > 1 else {},
        "num_steps": len(windows),
        "missing": missing,
    }
