"""Plots of a run's metrics over steps: ``python -m hetrl.plot RUN [--out DIR]``.

Reads ``RUN/metrics.jsonl`` (works while the run is writing it) and writes one PNG per panel into
``RUN/plots/``: reward, length, kl, entropy, mismatch, throughput, time. Each panel stacks one axis per
group of comparable series (same unit); a panel none of whose series were logged is skipped and
reported. Headless: matplotlib's Agg backend, no display needed.
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


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetrl.plot", description="PNG plots of a run's metrics over steps.")
    parser.add_argument("run", help="run directory (holds metrics.jsonl)")
    parser.add_argument("--out", help="output folder (default RUN/plots)")
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
