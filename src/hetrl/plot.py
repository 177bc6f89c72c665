"""Plots of a run: ``python -m hetrl.plot RUN [--out DIR] [--steps N]``.

Reads ``RUN/metrics.jsonl`` (works while the run is writing it) and writes one PNG per panel into
``RUN/plots/``: reward, length, kl, entropy, mismatch, throughput, time. Each panel stacks one axis per
group of comparable series (same unit); a panel none of whose series were logged is skipped and
reported. Headless: matplotlib's Agg backend, no display needed.

Where the run recorded its timeline (``monitor.timeline``, :mod:`hetrl.control.timeline`), it also
draws ``timeline.png``, a Gantt chart of the last ``--steps`` RL steps across every rank (each
phase a bar, each control message an arrow from its sender to its receiver), and prints where a
step goes: the median seconds per step of each rank's phases and each message's latency.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from matplotlib.ticker import MaxNLocator  # noqa: E402

from hetrl.control import rundir, timeline  # noqa: E402
from hetrl.control.plan import Plan  # noqa: E402
from hetrl.monitor import names  # noqa: E402
from hetrl.monitor.sinks import METRICS_FILE, read_jsonl  # noqa: E402

# panel -> axes (top to bottom) -> documented metric names or templates drawn on that axis.
PANELS: dict[str, list[list[str]]] = {
    "reward": [[names.REWARD_MEAN, "reward/<source>/mean"], ["reward/task/<task>/mean"]],
    "length": [[names.RESPONSE_LENGTH_MEAN, names.RESPONSE_LENGTH_MAX], [names.RESPONSE_LENGTH_TRUNCATED_FRAC]],
    "kl": [[names.APPROX_KL, names.POLICY_KL, names.LOSS_KL]],
    "entropy": [[names.ENTROPY]],
    "mismatch": [[names.MISMATCH_K3_KL], [names.MISMATCH_MAX_ABS_LOGPROB_DIFF], [names.MISMATCH_PROB_RATIO_MEAN]],
    "throughput": [["throughput/<role>_tokens_per_s"]],
    # Where a step's wall time goes: generation, scoring, training, the weight push, and waiting.
    "time": [[names.TIME_STEP, *(names.time_phase(phase) for phase in names.TIME_PHASES)]],
}


def _matching(pattern: str, available: Sequence[str]) -> list[str]:
    if "<" not in pattern:
        return [pattern] if pattern in available else []
    spec = next(s for s in names.METRICS if s.name == pattern)
    regex = spec.pattern()
    return sorted(n for n in available if regex.match(n))


def series_by_step(steps: Mapping[int, Mapping[str, float]], name: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric, only the steps that logged it."""
    xs = [s for s, m in steps.items() if name in m]
    return xs, [steps[s][name] for s in xs]


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> dict[Path, list[str]]:
    """Write the panels' PNGs; returns each written file with the metric series drawn in it."""
    run_dir = Path(run_dir)
    metrics_path = run_dir / METRICS_FILE
    if not metrics_path.is_file():
        raise FileNotFoundError(f"no {METRICS_FILE} in {run_dir}: is this a run directory?")
    steps = read_jsonl(metrics_path)
    available = sorted({name for m in steps.values() for name in m})
    out = Path(out_dir) if out_dir is not None else run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written: dict[Path, list[str]] = {}
    for panel, groups in PANELS.items():
        axes_series = [[n for pattern in group for n in _matching(pattern, available)] for group in groups]
        axes_series = [g for g in axes_series if g]
        if not axes_series:
            continue
        fig, axes = plt.subplots(len(axes_series), 1, figsize=(8, 2.6 * len(axes_series)), sharex=True, squeeze=False)
        for ax, series in zip(axes[:, 0], axes_series):
            for name in series:
                ax.plot(*series_by_step(steps, name), label=name, linewidth=1.2)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="best")
        axes[-1, 0].set_xlabel("step")
        axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.suptitle(f"{run_dir.name}: {panel}")
        fig.tight_layout()
        path = out / f"{panel}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written[path] = [n for g in axes_series for n in g]
    return written


def plot_timeline(run_dir: str | Path, out_dir: str | Path | None = None, steps: int = 3) -> Path | None:
    """A Gantt chart of the run's last ``steps`` RL steps across its ranks; None without a timeline."""
    run_dir = Path(run_dir)
    records = timeline.read_timeline(run_dir)
    windows = sorted(timeline.step_windows(records).items())[-steps:]
    if not windows:
        return None
    start, end = windows[0][1][0], windows[-1][1][1]
    shown = [r for r in records if r.t1 >= start and r.t0 <= end and r.name != "step"]  # a step is the chart's frame
    who_of_rank = {
        a.world_rank: f"{a.role}_{a.role_rank}" for a in Plan.from_json((run_dir / rundir.PLAN).read_text()).assignments
    }
    rows = sorted({r.who for r in shown}, key=lambda who: (who != "orchestrator_0", who))
    row = {who: i for i, who in enumerate(rows)}
    phases = sorted({r.name for r in shown if r.source is None})
    colour = {name: plt.get_cmap("tab20")(i % 20) for i, name in enumerate(phases)}
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.7 * len(rows)))
    for r in shown:
        if r.source is None:
            ax.barh(row[r.who], r.t1 - r.t0, left=r.t0 - start, height=0.6, color=colour[r.name], edgecolor="none")
        elif who_of_rank.get(r.source) in row:
            ax.annotate(
                "",
                xy=(r.t1 - start, row[r.who]),
                xytext=(r.t0 - start, row[who_of_rank[r.source]]),
                arrowprops={"arrowstyle": "->", "linewidth": 0.4, "alpha": 0.5, "color": "black"},
            )
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlabel(f"seconds since the start of RL step {windows[0][0] + 1}")
    ax.legend(
        handles=[plt.Rectangle((0, 0), 1, 1, color=colour[name]) for name in phases],
        labels=phases,
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
    )
    ax.grid(axis="x", alpha=0.3)
    fig.suptitle(
        f"{run_dir.name}: RL steps {windows[0][0] + 1}-{windows[-1][0] + 1} across ranks (arrows: control messages)"
    )
    fig.tight_layout()
    out = Path(out_dir) if out_dir is not None else run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "timeline.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def where_a_step_goes(run_dir: str | Path) -> list[str]:
    """The timeline's median seconds per RL step of each phase and each message's latency, as text lines."""
    records = timeline.read_timeline(Path(run_dir))
    if len(timeline.step_windows(records)) < 2:
        return []
    lines = ["where a step goes (median per RL step after the first):"]
    lines += [f"  {seconds * 1000:9.1f} ms  {phase}" for phase, seconds in timeline.phase_medians(records).items()]
    lines += [
        f"  {latency * 1000:9.2f} ms  x{count:<5.1f} {hop}"
        for hop, (latency, count) in timeline.hop_latencies(records).items()
    ]
    return lines


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hetrl.plot", description="PNG plots of a run's metrics over steps, and of its timeline."
    )
    parser.add_argument("run", help="run directory (holds metrics.jsonl)")
    parser.add_argument("--out", help="output folder (default RUN/plots)")
    parser.add_argument(
        "--steps", type=int, default=3, help="RL steps the timeline's Gantt chart shows (the last ones)"
    )
    args = parser.parse_args(list(argv))
    try:
        written = plot_run(args.run, args.out)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path, series in written.items():
        print(f"{path}: {', '.join(series)}")
    missing = sorted(set(PANELS) - {p.stem for p in written})
    if missing:
        print(f"skipped (no data): {', '.join(missing)}")
    gantt = plot_timeline(args.run, args.out, args.steps)
    if gantt is not None:
        print(f"{gantt}: RL steps across ranks")
        print("\n".join(where_a_step_goes(args.run)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
