"""hetrl's embedded default vs TRL's GRPOTrainer, same workload, side by side: `python bench/vs_trl.py`.

What is compared: the per-step wall time of GRPO on tiny_grpo's workload (16 prompts x 8 samples of
1-digit sums, up to 24 new tokens, temperature 1, fp32 on this CPU), run by hetrl as a user runs it
(`launch.py recipe=tiny_grpo`: vLLM engine, Megatron trainer, reward workers, every role its own
process) and by TRL 1.16's `GRPOTrainer` (one process, HF `generate`), and the held-out reward of
the two final policies. Why: TRL is what a user would otherwise reach for; hetrl's machinery must
at least not cost more per step than TRL's single process on the smallest workload, and should win
where generation dominates.

Kept equal (bench/trl_grpo_step.py maps the resolved recipe to TRL and says what is not mirrored):
- the initial policy: hetrl's own warm start (tiny_grpo's 32 supervised steps, as tests/conftest.py
  makes it, on demonstrations from the training side of the seed's held-out split: the eval draw
  depends on run.seed, so each seed has its own), exported as an HF checkpoint with tokenizer and
  chat template; both RL runs of the seed start from it (`model.hf_checkpoint=CKPT warm_start.steps=0`);
- the prompts: hetrl's training stream (the training side of its held-out split, in stream order),
  dumped here with hetrl's prompt token ids, which the TRL side checks against its tokenisation;
- the reward: hetrl's rubric and trainer-side DAPO overlong penalty, called as code in TRL's process;
- the hyperparameters, read by the TRL side from the same recipe and overrides as the hetrl run.
TRL lives in a venv of its own, .bench/trl-venv (git-ignored), created on first use and reused.

Reported: the median step time of each at steady state (each run's second half of steps: the first
half is warm-up, see after_warm_up), every step's time, hetrl's generate/train split and TRL's
generation time beside them, each seed's ratio, and the held-out mean reward (`launch.py eval`,
mean@16 over tiny_grpo's 30 held-out tasks: sums carved out of the training side both runs train
on, hetrl.env.tasks.split) of the initial policy and of both final policies, with the paired
difference (hetrl - TRL, seed by seed) and its standard error: "on par" within two (given from 4
seeds on). With --large, the same timing (no eval) on a ~44M-parameter model
(random init, all else equal; --large-seeds runs), where generation weighs more, in bf16 on both sides where the CPU
multiplies bf16 natively (--large-precision: hetrl's trainer.precision=bf16 with its engine in bf16, TRL's bf16=True,
i.e. autocast; both keep fp32 master weights), else in fp32. Headline (last line): TRL step / hetrl step, the median
over seeds of each seed's ratio, every one printed, never the best (goal >= 1.0x).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

import _launch

ROOT = Path(__file__).resolve().parents[1]
# bench/math_verify.py would shadow the math_verify package (hetrl's reward code imports it): src/ in its place
sys.path[:] = [str(ROOT / "src"), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

TRL_VENV = ROOT / ".bench" / "trl-venv"
# torch first, alone: pip's config here serves the CPU wheel (as install.sh relies on); trl's own
# requirements would otherwise be free to pull another build. math-verify, pydantic and pyyaml are
# hetrl's reward and config code, which the TRL side imports; pinned to the project venv's versions.
TRL_REQUIREMENTS = (
    ["torch==2.13.0"],
    ["trl==1.16.0", "transformers==5.19.0", "math-verify==0.9.0", "pydantic==2.14.4", "pyyaml==6.0.4"],
)
RUN_TIMEOUT_S = 900
INSTALL_TIMEOUT_S = 1800  # each pip install of the TRL venv (torch's wheel is large)
run = partial(_launch.run, timeout_s=RUN_TIMEOUT_S)
launch = partial(_launch.launch, timeout_s=RUN_TIMEOUT_S)
# tests/conftest.py's WARM_START: tiny_grpo's warm start, then the smallest RL step there is at a
# learning rate that leaves the warm-started weights as they are (run.steps cannot be 0). The recipe's
# eval.num_tasks stays: the demonstrations come from the training side of that held-out split.
WARM_START = [
    "run.name=warm_start",
    "run.steps=1",
    "run.prompts_per_step=1",
    "algorithm.group_size=2",
    "trainer.lr=1e-12",
    "eval.k=1",
    "monitor.rollout_store.enabled=false",
]
# ~44M parameters with tiny_llama's 128-token vocabulary: 8 x (0.79M attention + 4.72M MLP) + 0.13M.
MODEL_44M = [
    "model.hidden_size=512",
    "model.num_layers=8",
    "model.num_attention_heads=8",
    "model.num_query_groups=4",
    "model.ffn_hidden_size=3072",
]
# Timing only: the loop's own evals kept small, and (as in bench/schedules.py) a learning rate at which
# the compute is real but the policy does not move. At 5e-4 the overlong penalty taught the random
# init to stop after ~3 tokens within one step, and the rest of the run generated next to nothing.
LARGE_TIMING = ["eval.num_tasks=8", "eval.k=1", "trainer.lr=1e-12"]
# Held-out "on par" is judged from this many seeds on: a standard error from fewer is itself too noisy.
MIN_SEEDS_FOR_VERDICT = 4


# --------------------------------------------------------------------------- processes


def trl_python() -> Path:
    """The TRL venv's interpreter, creating the venv on first use."""
    python, stamp = TRL_VENV / "bin" / "python", TRL_VENV / ".installed"
    wanted = json.dumps(TRL_REQUIREMENTS)
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(
        f"vs_trl: creating the TRL venv at {TRL_VENV} ({', '.join(sum(TRL_REQUIREMENTS, []))}; a few minutes)",
        flush=True,
    )
    what = f"vs_trl: creating the TRL venv at {TRL_VENV}"
    run([sys.executable, "-m", "venv", "--clear", str(TRL_VENV)], what, timeout_s=INSTALL_TIMEOUT_S)
    for group in TRL_REQUIREMENTS:
        run(
            [str(python), "-m", "pip", "install", "-q", *group],
            f"{what}: pip install {' '.join(group)}",
            timeout_s=INSTALL_TIMEOUT_S,
        )
    stamp.write_text(wanted)
    return python


# --------------------------------------------------------------------------- the two sides


def initial_checkpoint(out: Path, seed: int) -> Path:
    """tiny_grpo's warm-started policy of run.seed ``seed`` as an HF dir (tokenizer and chat template included)."""
    launch("recipe=tiny_grpo", f"run.output_dir={out}", *WARM_START, f"run.seed={seed}", what="hetrl's warm start")
    checkpoint = out / "initial_hf"
    launch("export", str(out / "warm_start"), f"out={checkpoint}", what="the export of the warm-started policy")
    return checkpoint


def dump_training_prompts(overrides: list[str], checkpoint: Path, path: Path) -> None:
    """The prompts hetrl trains on under ``overrides``, in its order: the orchestrator's stream over the
    training side of the held-out split, each prompt rendered by the math env and hetrl's chat codec."""
    from transformers import AutoTokenizer

    from hetrl.config.loader import load_config
    from hetrl.env.chat import ChatCodec
    from hetrl.env.registry import build_env, build_held_out_split
    from hetrl.env.tasks.base import TaskStream

    cfg = load_config("tiny_grpo", overrides)
    split = build_held_out_split(cfg.env, seed=cfg.run.seed, num_eval_tasks=cfg.eval.num_tasks)
    if split.report.reward_kind != "held-out":
        raise SystemExit(f"vs_trl: the eval tasks are not held out of training: {split.report.summary()}")
    print(f"vs_trl: held-out split of seed {cfg.run.seed}: {split.report.summary()}", flush=True)
    stream = TaskStream(split.training, seed=cfg.run.seed)
    codec, env = ChatCodec(AutoTokenizer.from_pretrained(checkpoint)), build_env(cfg.env)
    with path.open("w") as f:
        for task, seed in stream.take(cfg.run.steps * cfg.run.prompts_per_step):
            messages = asyncio.run(env.reset(task, seed))
            f.write(
                json.dumps({"prompt": messages, "prompt_ids": codec.prompt_ids(messages), "answer": task.answer}) + "\n"
            )


def run_hetrl(overrides: list[str], out: Path, name: str) -> tuple[Path, list[dict]]:
    """hetrl's run directory and its per-step metrics."""
    launch("recipe=tiny_grpo", f"run.output_dir={out}", f"run.name={name}", *overrides, what=f"hetrl run {name}")
    run_dir = out / name
    return run_dir, [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def run_trl(python: Path, checkpoint: Path, overrides: list[str], out: Path) -> tuple[Path, dict]:
    """TRL's final model dir and its timings (bench/trl_grpo_step.py in the TRL venv, on every core)."""
    tasks = out / "tasks.jsonl"
    out.mkdir(parents=True)
    dump_training_prompts(overrides, checkpoint, tasks)
    run(
        [str(python), str(ROOT / "bench" / "trl_grpo_step.py"), str(checkpoint), str(tasks), str(out), *overrides],
        f"TRL run {out.name}",
        env={"OMP_NUM_THREADS": str(os.cpu_count())},
    )
    return out / "model", json.loads((out / "timings.json").read_text())


def held_out_reward(checkpoint: Path, overrides: list[str], out: Path) -> float:
    """``launch.py eval``'s mean reward of ``checkpoint`` on the held-out tasks of the run ``overrides`` describe."""
    launch(
        "eval",
        "recipe=tiny_grpo",
        f"checkpoint={checkpoint}",
        *overrides,
        "--out",
        str(out),
        what=f"eval of {checkpoint}",
    )
    return json.loads(out.read_text())["mean_reward"]


# --------------------------------------------------------------------------- one configuration


def after_warm_up(values: list[float]) -> float:
    """The median of a run's second half: its steady state. The first half is warm-up: on the 44M model
    hetrl's ranks take ~5 steps to settle (their heaps stop growing: forward-backward 7.8 -> 6.6 s, the
    weight hand-over 0.59 -> 0.17 s), while TRL's steps are flat from the second on."""
    return statistics.median(values[max(1, len(values) // 2) :])


def side(steps: list[float], generate: list[float], lengths: list[float], rewards: list[float]) -> dict:
    """One side's steady-state medians, its step times and training reward by step, and the load it ran under."""
    return {
        "step": after_warm_up(steps),
        "generate": after_warm_up(generate),
        "length": after_warm_up(lengths),
        "steps": steps,
        "rewards": rewards,
        "load": os.getloadavg()[0],
    }


def time_both(python: Path, checkpoint: Path | None, overrides: list[str], out: Path, seed: int) -> dict:
    """One seed of both sides on one configuration. With no ``checkpoint``, hetrl starts from a random
    init and TRL from that same init (the hetrl run's initial_model)."""
    overrides = [
        *overrides,
        *([f"model.hf_checkpoint={checkpoint}"] if checkpoint else []),
        "warm_start.steps=0",
        f"run.seed={seed}",
    ]
    run_dir, metrics = run_hetrl(overrides, out, f"hetrl_s{seed}")
    steps = [m for m in metrics if "time/step" in m]
    hetrl = side(
        *([m[key] for m in steps] for key in ("time/step", "time/generate", "response_length/mean", "reward/mean"))
    )
    trl_model, trl = run_trl(python, checkpoint or run_dir / "initial_model", overrides, out / f"trl_s{seed}")
    return {
        "seed": seed,
        "checkpoint": checkpoint,
        "overrides": overrides,
        "run_dir": run_dir,
        "trl_model": trl_model,
        "hetrl": hetrl,
        "TRL": side(trl["step_s"], trl["generate_s"], trl["response_length"], trl["reward"]),
    }


def report_timing(label: str, results: list[dict]) -> float:
    """Print both sides' medians over seeds, each seed's ratio and each run's training reward by step; return the
    median over seeds of TRL / hetrl step time (each seed's pair ran back to back, under the same load)."""
    for name in ("hetrl", "TRL"):
        median = {key: statistics.median(r[name][key] for r in results) for key in ("step", "generate", "length")}
        loads = " ".join(f"{r[name]['load']:.1f}" for r in results)
        print(
            f"{label} {name:>5}: {median['step']:.2f} s/step (generate {median['generate']:.2f} s, the rest "
            f"{median['step'] - median['generate']:.2f} s; {median['length']:.1f} tokens a response; "
            f"load {loads} after its runs)"
        )
    ratios = [r["TRL"]["step"] / r["hetrl"]["step"] for r in results]
    for r, ratio in zip(results, ratios, strict=True):
        print(
            f"{label} seed {r['seed']}: hetrl {r['hetrl']['step']:.2f} s/step, TRL {r['TRL']['step']:.2f} s/step: "
            f"{ratio:.2f}x"
        )
    for r in results:
        for name in ("hetrl", "TRL"):
            print(
                f"{label} step time by step, seed {r['seed']}, {name:>5}: "
                f"{' '.join(f'{x:.2f}' for x in r[name]['steps'])}"
            )
            print(
                f"{label} training reward by step, seed {r['seed']}, {name:>5}: "
                f"{' '.join(f'{x:.2f}' for x in r[name]['rewards'])}"
            )
    return statistics.median(ratios)


def report_eval(results: list[dict], out: Path) -> None:
    """Held-out mean reward of the initial policy and of both final ones: each seed's, the medians, and
    the paired difference (hetrl - TRL, same seed) with its standard error: on par when within 2 SE."""
    from hetrl.config.loader import load_config

    scores: dict[str, list[float]] = {"initial": [], "hetrl": [], "TRL": []}
    for r in results:
        for name, path in (
            ("initial", r["checkpoint"]),
            ("hetrl", r["run_dir"] / "checkpoints"),
            ("TRL", r["trl_model"]),
        ):
            scores[name].append(held_out_reward(path, r["overrides"], out / f"eval_{name}_s{r['seed']}.json"))
    before = statistics.median(scores["initial"])
    measure = load_config("tiny_grpo", results[0]["overrides"]).eval
    for name in ("hetrl", "TRL"):
        print(
            f"held-out mean reward (launch.py eval, {measure.num_tasks} tasks, mean@{measure.k}) {name:>5}: before "
            f"{before:.3f}, after {statistics.median(scores[name]):.3f} (by seed: before "
            f"{' '.join(f'{x:.3f}' for x in scores['initial'])}, after {' '.join(f'{x:.3f}' for x in scores[name])})"
        )
    differences = [h - t for h, t in zip(scores["hetrl"], scores["TRL"], strict=True)]
    if len(differences) >= MIN_SEEDS_FOR_VERDICT:
        mean, se = statistics.mean(differences), statistics.stdev(differences) / len(differences) ** 0.5
        verdict = "on par" if abs(mean) <= 2 * se else ("hetrl higher" if mean > 0 else "hetrl lower")
        print(
            f"held-out hetrl - TRL, paired by seed: {mean:+.3f} +- {se:.3f} (standard error, {len(differences)} "
            f"seeds): {verdict}"
        )
    else:
        print(
            f"held-out hetrl - TRL, paired by seed: {' '.join(f'{d:+.3f}' for d in differences)} "
            f"(--seeds {MIN_SEEDS_FOR_VERDICT} or more for a verdict: seeds differ by ~0.03 in either direction)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15, help="RL steps per run on tiny_grpo (timed: the second half)")
    parser.add_argument(
        "--seeds", type=int, default=3, help="runs of each side (run.seed 0, 1, ...); medians over them"
    )
    parser.add_argument("--large", action="store_true", help="also time the ~44M-parameter model (no eval)")
    parser.add_argument(
        "--large-steps", type=int, default=8, help="RL steps per run on the ~44M model (timed: the second half)"
    )
    parser.add_argument("--large-seeds", type=int, default=3, help="runs of each side on the ~44M model (timing only)")
    parser.add_argument(
        "--large-precision",
        choices=("auto", "bf16", "fp32"),
        default="auto",
        help="both sides' precision on the ~44M model; auto: bf16 where the CPU multiplies bf16 natively",
    )
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="hetrl-bench-vs-trl-"))
    print(f"vs_trl: runs under {out}; {_launch.machine()}", flush=True)
    python = trl_python()

    small = [
        time_both(
            python, initial_checkpoint(out / f"warm_s{seed}", seed), [f"run.steps={args.steps}"], out / "tiny", seed
        )
        for seed in range(args.seeds)
    ]
    ratio = report_timing("tiny_grpo", small)
    report_eval(small, out)
    if args.large:
        precision = args.large_precision
        if precision == "auto":
            from hetrl.trainer.parallel import cpu_has_native_bf16

            precision = "bf16" if cpu_has_native_bf16() else "fp32"
        large = [
            time_both(
                python,
                None,
                [f"run.steps={args.large_steps}", *MODEL_44M, *LARGE_TIMING, f"trainer.precision={precision}"],
                out / "44m",
                seed,
            )
            for seed in range(args.large_seeds)
        ]
        print(f"vs_trl_44m: {report_timing(f'44M {precision}', large):.2f}x ({precision} on both sides; goal >= 2x)")
    print(f"vs_trl: {ratio:.2f}x (goal >= 1.0x)")


if __name__ == "__main__":
    main()
