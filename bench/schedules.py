"""Step time of the sync, one-step-off and async schedules on the same workload: `python bench/schedules.py`.

Each schedule runs the real loop (`launch.py recipe=tiny_grpo`, every role its own process) with
disaggregated placement, so generation and training each get one of the two cores and can overlap.
The workload is held fixed and balanced so that the schedules, not the policy, differ:
- `trainer.lr=1e-12`: the steps' compute is real but the policy does not move. With a learning
  policy, the DAPO overlong penalty shortened responses at a different pace per schedule (async
  runs fell to 2-5 tokens, sync stayed at ~15), and the step times compared different workloads.
- tiny_llama's own 0.4M-parameter shape (not tiny_grpo's 1.2M), 64 samples of up to 96 tokens in
  one micro-batch: generating and training a step then cost about the same here (0.72 s, 0.62 s).
  With tiny_grpo's shape training costs 1.7x what generation does (1.43 s, 0.83 s), which caps
  any overlap at (g + t) / max(g, t) = 1.58x, whatever the schedule.
Reported per run: the mean step time per schedule (steps after the first two: the schedule's
throughput; not the median, because an async run's steps alternate between train-only steps and
steps that wait for generation, and a median jumps between the two modes from run to run: 0.56 and
1.05 s/step for two runs of the same code whose means were 1.06 and 1.08), the speedups over sync,
and the async step time over max(generation time, training time) measured in the sync run,
where the two phases do not overlap (below 1: async also batches several steps' generation
together). The three schedules run ``--runs`` times (default 3), interleaved (sync, one-step-off,
async, then again) so that the machine's slow and quiet spells hit each alike; one run's speedup
moved by a quarter from run to run on the shared 2-core machine (1.66x, 2.11x, 1.91x at e9565b0),
so every run is printed and the figures below them are the medians over runs. Headline: the
median async speedup over sync (goal >= 1.6x; ratio to max() <= 1.15).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from _launch import launch, machine

STEPS = 10
RUN_TIMEOUT_S = 900  # a run takes ~1 min; the liveness watchdog ends a hung one sooner (tiny_grpo: 120 s)
WORKLOAD = [
    f"run.steps={STEPS}",
    "warm_start.steps=0",
    "eval.num_tasks=4",
    "run.prompts_per_step=8",
    "algorithm.group_size=8",
    "rollout.placement=disaggregated",
    "rollout.max_tokens=96",
    "env.max_episode_tokens=200",
    "rollout.partial_rollout=true",
    "run.threads_per_process=1",
    "monitor.rollout_store.enabled=false",
    "checkpoint.every=0",
    "trainer.micro_batch_size=64",
    "trainer.lr=1e-12",
    "model.hidden_size=128",
    "model.ffn_hidden_size=256",
]
SCHEDULES = {
    "sync": ["schedule.type=sync"],
    "one_step_off": ["schedule.type=one_step_off", "schedule.max_staleness=1"],
    "async": ["schedule.type=async", "schedule.max_staleness=2"],
}


def run(schedule: str, out: Path, name: str) -> list[dict]:
    launch(
        "recipe=tiny_grpo",
        f"run.output_dir={out}",
        f"run.name={name}",
        *WORKLOAD,
        *SCHEDULES[schedule],
        what=f"{schedule} run (see {out / name})",
        timeout_s=RUN_TIMEOUT_S,
    )
    return [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]


def mean_of(metrics: list[dict], key: str) -> float:
    """The mean of ``key`` over the steps after the first two (the start's warm-up)."""
    return statistics.mean(m[key] for m in metrics[2:] if key in m)


def measure(out: Path, index: int) -> dict[str, float]:
    """One run of each schedule: step times, the sync run's phases, and the ratios derived from them."""
    results = {name: run(name, out, f"{name}_{index}") for name in SCHEDULES}
    figures = {name: mean_of(m, "time/step") for name, m in results.items()}
    figures["generate"] = mean_of(results["sync"], "time/generate")
    figures["train"] = mean_of(results["sync"], "time/train")
    figures["one_step_off_speedup"] = figures["sync"] / figures["one_step_off"]
    figures["async_speedup"] = figures["sync"] / figures["async"]
    figures["async_over_max"] = figures["async"] / max(figures["generate"], figures["train"])
    return figures


def describe(f: dict[str, float]) -> str:
    return (
        f"sync {f['sync']:.2f} s/step (generate {f['generate']:.2f} s, train {f['train']:.2f} s), one_step_off "
        f"{f['one_step_off']:.2f} s ({f['one_step_off_speedup']:.2f}x), async {f['async']:.2f} s "
        f"({f['async_speedup']:.2f}x); async / max(generate, train) = {f['async_over_max']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each schedule (the headline is their median)")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="hetrl-bench-schedules-"))
    print(f"schedules: runs under {out}; {machine()}", flush=True)
    runs = []
    for index in range(args.runs):
        runs.append(measure(out, index))
        print(f"run {index + 1}: {describe(runs[-1])}", flush=True)
    median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    print(f"medians over {args.runs} runs: {describe(median)} (goal <= 1.15)")
    print(f"schedules: {median['async_speedup']:.2f}x (goal >= 1.6x)")


if __name__ == "__main__":
    main()
