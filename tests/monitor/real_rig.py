"""The rig of the real-run tests: a tiny GRPO run through ``launch.py`` (MPI roles, vLLM, Megatron)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEPS, PROMPTS, GROUP, WARM_STEPS = 3, 4, 4, 2
WORKLOAD = [
    "recipe=tiny_grpo",
    f"run.steps={STEPS}",
    f"warm_start.steps={WARM_STEPS}",
    f"run.prompts_per_step={PROMPTS}",
    f"algorithm.group_size={GROUP}",
    "eval.num_tasks=8",
    "eval.k=1",
    "eval.temperature=0.0",  # greedy, one sample per task: the tests count eval samples
    "reward.functions=[{name: math, kwargs: {answer_tag: answer}}, {name: length, kwargs: {target_tokens: 8}}]",
    "algorithm.entropy_coef=0.001",
    "monitor.rollout_store.flush_every=8",
    # A big RL step so that 3 steps visibly change the greedy eval (the comparison in test_real_run needs it).
    "trainer.lr=3e-3",
    "trainer.lr_warmup_steps=0",
    "rollout.max_tokens=12",
]


def run_cli(
    args: list[str], timeout_s: float = 1200, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)


def launch(output_dir: Path, extra: list[str], faults: str | None = None) -> tuple[Path, subprocess.CompletedProcess]:
    """Run the workload (plus ``extra`` overrides, ``faults`` as HETRL_INJECT_FAULT); its run directory and process."""
    env = {"HETRL_INJECT_FAULT": faults} if faults else None
    proc = run_cli(["launch.py", *WORKLOAD, *extra, f"run.output_dir={output_dir}"], env_extra=env)
    return output_dir / "tiny_grpo", proc


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def read_metrics(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / "metrics.jsonl")


def read_alerts(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / "alerts.jsonl")


def output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout[-3000:] + proc.stderr[-3000:]
