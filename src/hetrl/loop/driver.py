"""The orchestrator's main: evaluate, warm-start, run the schedule, evaluate again, report.

It prints the held-out reward before and after training and writes ``summary.json`` into the run
directory, so "did it learn" is one line to read.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from hetrl.config.schema import HetrlConfig
from hetrl.control.comm import RoleContext
from hetrl.loop.orchestrator import Orchestrator
from hetrl.types import Sample

logger = logging.getLogger(__name__)


def eval_tasks(cfg: HetrlConfig) -> list[tuple[Any, int]]:
    """A fixed held-out draw: the eval source, or the training source under another seed."""
    from hetrl.env.registry import build_task_stream

    source = cfg.env.eval_tasks or cfg.env.tasks
    stream = build_task_stream(source, seed=cfg.run.seed + 1_000_003)
    return [stream.next() for _ in range(cfg.eval.num_tasks)]


def demonstrations(cfg: HetrlConfig, codec: Any, tokenizer: Any, count: int, stream: Any, step: int) -> list[list[Sample]]:
    """Warm-start demonstrations: the environment's own prompt, the reference answer as completion."""
    from hetrl.env.registry import build_env

    env = build_env(cfg.env)
    groups = []
    for index in range(count):
        task, seed = stream.next()
        prompt_ids = codec.prompt_ids(asyncio.run(env.reset(task, seed)))
        completion = codec.encode(cfg.warm_start.template.format(answer=task.answer)) + [tokenizer.eos_token_id]
        n = len(completion)
        sample_id = f"w{step}.{index}"
        groups.append([Sample(sample_id, sample_id, task.source, prompt_ids, completion, [1] * n, [0.0] * n, [0] * n, answer=task.answer)])
    return groups


def run_orchestrator(ctx: RoleContext, cfg: HetrlConfig, run_dir: Path, model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from hetrl.env.chat import ChatCodec
    from hetrl.env.registry import build_task_stream
    from hetrl.monitor.core import Monitor
    from hetrl.monitor.metrics import staleness_metrics

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    codec = ChatCodec(tokenizer)
    orch = Orchestrator(ctx, cfg, run_dir, tokenizer)
    monitor = Monitor(cfg.monitor, run_dir, cfg.run.steps, roles=("rollout", "reward", "trainer"), run_config=cfg.model_dump(mode="json"))
    held_out = eval_tasks(cfg)
    summary: dict[str, Any] = {"eval_before": orch.evaluate(held_out)[0]}
    try:
        demo_stream = build_task_stream(cfg.env.tasks, seed=cfg.run.seed + cfg.warm_start.seed_offset)
        for w in range(cfg.warm_start.steps):
            orch.train(-1 - w, demonstrations(cfg, codec, tokenizer, cfg.warm_start.batch_size, demo_stream, w), supervised=True)
        if cfg.warm_start.steps:
            summary["eval_after_warm_start"] = orch.evaluate(held_out)[0]
        schedule = cfg.schedule
        max_lag = 0 if schedule.type == "sync" else schedule.max_staleness
        look_ahead = {"sync": 0, "one_step_off": 1, "async": schedule.max_staleness}[schedule.type]
        target = cfg.run.prompts_per_step * (1 + look_ahead)
        for step in range(cfg.run.steps):
            with monitor.timer(step, "generate"):
                orch.top_up(target)
                batch, drop_metrics = orch.collect_batch(max_lag, target)
            if look_ahead:
                orch.top_up(target)  # the next step's generation overlaps this step's training
            samples = [s for g in batch for s in g]
            monitor.log(step, {**staleness_metrics(samples, orch.version, int(drop_metrics["staleness/dropped"]))})
            monitor.record_rollouts(step, samples)
            with monitor.timer(step, "train"):
                done = orch.train(step, batch)
            monitor.log(step, done.metrics)
            if cfg.eval.every and (step + 1) % cfg.eval.every == 0:
                mean, metrics = orch.evaluate(held_out)
                monitor.log(step, metrics)
            monitor.end_step(step)
        summary["eval_after"] = orch.evaluate(held_out)[0]
        summary["trained_samples"] = len(orch.ledger.trained)
        summary["dropped_stale_samples"] = orch.ledger.dropped_stale
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        print(f"[hetrl] held-out mean reward: before {summary['eval_before']:.3f}"
              + (f", after warm start {summary['eval_after_warm_start']:.3f}" if cfg.warm_start.steps else "")
              + f", after {cfg.run.steps} RL steps {summary['eval_after']:.3f}", flush=True)
    finally:
        monitor.close()
        orch.shutdown()
