"""The orchestrator's main: evaluate, warm-start, run the schedule, evaluate again, report.

It prints the held-out split (which eval tasks training was kept from, hetrl.env.tasks.split) at
the start and the held-out reward before and after training at the end (a "training-set" reward
when the recipe accepts eval tasks that training sees: eval.allow_training_overlap), and writes both into
``summary.json`` in the run directory, so "did it learn" is one line to read. Checkpoints are taken every
``checkpoint.every``
RL steps, at the end, and at the first step boundary after a pre-emption signal; a resumed run
skips whatever its checkpoint's loop state says is done (see ``hetrl.loop.resume``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

from hetrl.config.schema import HetrlConfig
from hetrl.control import timeline
from hetrl.control.comm import RoleContext
from hetrl.env.chat import ChatCodec
from hetrl.env.envs.multimodal import swap_scenes
from hetrl.env.registry import build_env, build_held_out
from hetrl.env.runner import images_of
from hetrl.env.tasks.base import TaskStream
from hetrl.loop import resume
from hetrl.loop.orchestrator import Orchestrator
from hetrl.monitor import names
from hetrl.monitor.core import Monitor
from hetrl.monitor.metrics import staleness_metrics
from hetrl.records import Sample, id_order

logger = logging.getLogger(__name__)


def eval_tasks(cfg: HetrlConfig) -> list[tuple[Any, int]]:
    """The run's fixed held-out draw (hetrl.env.tasks.split), without building the training side."""
    return build_held_out(cfg.env, seed=cfg.run.seed, num_tasks=cfg.eval.num_tasks)


def demonstrations(
    cfg: HetrlConfig, codec: Any, tokenizer: Any, count: int, stream: Any, step: int
) -> list[list[Sample]]:
    """Warm-start demonstrations: the environment's own prompt (images included), the reference answer as completion."""
    env = build_env(cfg.env, sandbox=cfg.reward.sandbox)
    groups = []
    for index in range(count):
        task, seed = stream.next()
        messages = asyncio.run(env.reset(task, seed))
        prompt_ids = codec.prompt_ids(messages)
        completion = codec.encode(cfg.warm_start.template.format(answer=task.answer)) + [tokenizer.eos_token_id]
        n = len(completion)
        sample_id = f"w{step}.{index}"
        groups.append(
            [
                Sample(
                    sample_id,
                    sample_id,
                    task.source,
                    prompt_ids,
                    completion,
                    [1] * n,
                    [0.0] * n,
                    [0] * n,
                    answer=task.answer,
                    images=images_of(messages),
                )
            ]
        )
    return groups


def run_orchestrator(ctx: RoleContext, cfg: HetrlConfig, run_dir: Path, model_dir: Path) -> None:
    """The whole run; raises :class:`hetrl.loop.preempt.Preempted` when it stopped early on a signal."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    codec = ChatCodec(tokenizer)
    orch = Orchestrator(ctx, cfg, run_dir, tokenizer)
    state = resume.resume(ctx, cfg.checkpoint, orch, run_dir)
    summary = state.summary
    monitor = Monitor(
        cfg.monitor,
        run_dir,
        cfg.run.steps,
        roles=("rollout", "reward", "trainer"),
        run_config=cfg.model_dump(mode="json"),
    )
    orch.attach_monitor(monitor)
    held_out = orch.split.held_out
    summary["held_out_split"] = orch.split.report.as_dict()
    kind = orch.split.report.reward_kind  # "held-out", or "training-set" when training sees eval tasks
    print(f"[hetrl] {'held-out' if kind == 'held-out' else 'eval'} split: {orch.split.report.summary()}", flush=True)
    # Demonstrations come from the training side of the split too: a warm start must not see eval prompts.
    demo_stream = TaskStream(orch.split.training, seed=cfg.run.seed + cfg.warm_start.seed_offset)
    if state.demo_stream is not None:
        demo_stream.load_state_dict(state.demo_stream)
    try:
        if "eval_before" not in summary:
            summary["eval_before"] = orch.evaluate(held_out)[0]
        for w in range(state.warm_steps_done, cfg.warm_start.steps):
            demos = demonstrations(cfg, codec, tokenizer, cfg.warm_start.batch_size, demo_stream, w)
            orch.train(-1 - w, [[orch.hold(s) for s in group] for group in demos], supervised=True)
            state.warm_steps_done, state.demo_stream = w + 1, demo_stream.state_dict()
            resume.safe_point(ctx, orch, state)
        if cfg.warm_start.steps and "eval_after_warm_start" not in summary:
            summary["eval_after_warm_start"] = orch.evaluate(held_out)[0]
        for step in range(state.rl_steps_done, cfg.run.steps):
            rl_step(orch, cfg, monitor, step, held_out)
            state.rl_steps_done = step + 1
            if cfg.checkpoint.every and state.rl_steps_done % cfg.checkpoint.every == 0:
                resume.save(ctx, orch, state)
            resume.safe_point(ctx, orch, state)
        resume.save(ctx, orch, state)  # before the final eval: a pre-emption there loses no training
        summary["eval_after"] = orch.evaluate(held_out)[0]
        if cfg.eval.image_ablation:
            summary["eval_after_images_swapped"] = orch.evaluate(
                list(zip(swap_scenes([t for t, _ in held_out]), [s for _, s in held_out]))
            )[0]
        summary["trained_samples"] = state.trained_before + len(orch.ledger.trained)
        summary["dropped_stale_samples"] = orch.ledger.dropped_stale
        summary["refused_weight_pushes"] = orch.refused_pushes_total
        summary["samples"] = orch.ledger_report()  # every training sample id accounted for
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        print(reward_line(cfg, summary, kind), flush=True)
        if cfg.eval.image_ablation:
            print(
                f"[hetrl] image ablation: the final policy on the same tasks with each image moved to another task: "
                f"{summary['eval_after_images_swapped']:.3f} (with its own images {summary['eval_after']:.3f})",
                flush=True,
            )
    finally:
        monitor.close()
        orch.shutdown()


def reward_line(cfg: HetrlConfig, summary: dict[str, Any], kind: str) -> str:
    """The run's last word: the eval reward before and after training, named for what it measures (``kind``,
    hetrl.env.tasks.split.SplitReport.reward_kind): a training-set reward never passes for a held-out one."""
    measure = "greedy" if cfg.eval.temperature == 0 else f"mean@{cfg.eval.k}, temperature {cfg.eval.temperature:g}"
    return (
        f"[hetrl] {kind} mean reward ({cfg.eval.num_tasks} tasks, {measure}): before {summary['eval_before']:.3f}"
        + (f", after warm start {summary['eval_after_warm_start']:.3f}" if cfg.warm_start.steps else "")
        + f", after {cfg.run.steps} RL steps {summary['eval_after']:.3f}"
    )


def rl_step(orch: Orchestrator, cfg: HetrlConfig, monitor: Any, step: int, held_out: list[tuple[Any, int]]) -> None:
    """One RL step of the recipe's schedule: collect a batch (topping up generation), train, log."""
    max_lag = orch.staleness_bound()  # fixed, or where the adaptive bound stands after the previous step
    target = orch.dispatch_target(max_lag)
    t0 = time.time()
    with monitor.timer(step, "generate"), timeline.span("collect batch"):
        # Groups left over from the last step are generating already; with a look-ahead they go on
        # generating while this step trains (the batch counts against the target until trained).
        orch.top_up(target)
        batch, dropped_stale, dropped_uninformative = orch.collect_batch(max_lag, target)
    batch.sort(key=lambda group: id_order(group[0].sample_id))  # completion order varies; training must not
    samples = [s for g in batch for s in g]
    generated = sum(s.num_policy_tokens for s in samples)
    monitor.progress("rollout", tokens=generated)
    monitor.progress("reward", tokens=generated)
    monitor.log(
        step,
        {
            **staleness_metrics(samples, orch.version, dropped_stale),
            names.STALENESS_BOUND: float(max_lag),
            names.STALENESS_REGENERATED: float(orch.take_regenerated()),
            names.DYNAMIC_SAMPLING_DROPPED: float(dropped_uninformative),
            names.WEIGHT_SYNC_REFUSED: float(orch.take_refused_pushes()),
        },
    )
    with monitor.timer(step, "train"), timeline.span("train"):
        done = orch.train(step, batch)
    monitor.progress("trainer", tokens=sum(s.prompt_len + s.completion_len for s in samples))
    measured = monitor.record_rollouts(step, samples)  # the mismatch is in the trainer's metrics
    monitor.log(step, done.metrics)
    orch.observe_step({**measured, **done.metrics})  # the adaptive staleness bound of the next step
    if cfg.eval.every and (step + 1) % cfg.eval.every == 0:
        monitor.log(step, orch.evaluate(held_out)[1])
    monitor.end_step(step)
    timeline.record("step", t0, time.time(), step=step)
