"""Control plane: what the orchestrator spends to hand one moe_grpo step to the trainer.

A simulated step of ``moe_grpo`` at 128 and 1,024 nodes: fake ranks, no models, real messages. The
real plan of each size gives the trainer's ranks and its leader; a synthetic batch of the recipe's
shape (``run.prompts_per_step`` x ``algorithm.group_size`` samples, engine-like per-token lists)
crosses the real control plane (``hetrl.control.comm``: pickled mpi4py isend, polled receives)
between two processes under ``mpiexec -n 2``: world rank 0 is the orchestrator, world rank 1 plays
every trainer rank (each destination of the plan maps onto it).

Contender: the hand-over since issue 16: one ``TrainWork`` to the trainer's leader (which shares it
inside the trainer over torch.distributed: not the orchestrator's cost, not measured), answered by
one ``TrainDone`` of per-sample float32 arrays. Baseline: the hand-over before it: the same batch,
with per-token advantages, sent to every trainer rank (1,024 or 8,192 sends, each pickled afresh),
answered by one ``TrainDone`` of per-sample lists of Python floats. The baseline's sends are all
alike, so a measured subset of them (``--baseline-sends``) is timed and scaled to the plan's count;
bytes are exact (pickle sizes) either way.

Seconds: from the first send until the fake trainer holds the last work message, plus from the
reply's send until the orchestrator holds it (the fake trainer's own work in between is left out);
both processes read the same monotonic clock. Headline: the contender's orchestrator bytes per step
(sent + received) at 1,024 nodes over the pickled bytes of one batch (the ``TrainWork``'s samples).

    python bench/control_plane.py [--repeats 5] [--length-scale 8] [--baseline-sends 16]
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hetrl.records import Sample

NODE_COUNTS = (128, 1024)
HEADLINE_NODES = 1024
GOAL_RATIO = 2.0
# Lengths of moe_grpo's episodes at full scale (gsm_symbolic under a chat template; a reasoning
# model's completions, long-tailed, capped at rollout.max_tokens): our estimate, not a measurement.
PROMPT_TOKENS = (150, 300)  # uniform
COMPLETION_MEDIAN_TOKENS = 1500  # log-normal, sigma 0.75: mean ~2,000
CHARS_PER_TOKEN = 4  # of the decoded prompt_text / completion_text the runner keeps
STEP = 300  # versions above 255 pickle as 3 bytes, as they do after the first few hundred steps


@dataclass
class OldTrainWork:
    """The baseline's message: ``TrainWork`` before issue 16, per-token advantages included."""

    step: int
    samples: list[Sample]
    advantages: list[list[float]]
    supervised: bool = False


@dataclass
class OldTrainDone:
    """The baseline's reply: ``TrainDone`` before issue 16, log-probs as lists of Python floats."""

    step: int
    version: int
    metrics: dict[str, float]
    trainer_logprobs: list[list[float]] | None = None


# ------------------------------------------------------------------ the recipe and its batch


def recipe_plans() -> tuple[object, list[dict]]:
    """moe_grpo's config and, per node count, its trainer ranks and leader (the real planner)."""
    from hetrl.config import load_config
    from hetrl.control.plan import make_plan

    rows = []
    for nodes in NODE_COUNTS:
        cfg = load_config("moe_grpo", [f"nodes={nodes}"])
        plan = make_plan(cfg)
        trainer_ranks = plan.ranks_of("trainer")
        rows.append(
            {
                "nodes": nodes,
                "world": plan.world_size,
                "trainer_ranks": trainer_ranks,
                "leader": trainer_ranks[0],
                "orchestrator": plan.ranks_of("orchestrator")[0],
            }
        )
    return cfg, rows


def _text(rng: np.random.Generator, num_tokens: int) -> str:
    return rng.integers(97, 123, num_tokens * CHARS_PER_TOKEN, dtype=np.uint8).tobytes().decode("ascii")


def _token_ids(rng: np.random.Generator, num_tokens: int, vocab_size: int) -> list[int]:
    # Log-uniform over [1000, vocab): about one id in six above 65,535 (5 pickled bytes, 3 below).
    return np.exp(rng.uniform(np.log(1000), np.log(vocab_size), num_tokens)).astype(np.int64).tolist()


def synthetic_batch(cfg, length_scale: int, seed: int = 0) -> list[Sample]:
    """One step's rewarded samples, shaped like the math env's (single turn, every token the policy's)."""
    rng = np.random.default_rng(seed)
    max_tokens = cfg.rollout.max_tokens // length_scale
    samples = []
    for group in range(cfg.run.prompts_per_step):
        num_prompt = int(rng.integers(*PROMPT_TOKENS)) // length_scale
        prompt_ids, prompt_text = _token_ids(rng, num_prompt, cfg.model.vocab_size), _text(rng, num_prompt)
        for index in range(cfg.algorithm.group_size):
            n = min(max_tokens, max(1, int(rng.lognormal(np.log(COMPLETION_MEDIAN_TOKENS), 0.75)) // length_scale))
            version = STEP - int(rng.integers(0, cfg.schedule.max_staleness + 1))
            reward = float(rng.integers(0, 2))
            samples.append(
                Sample(
                    sample_id=f"t{group}.{index}",
                    group_id=f"t{group}",
                    task_name="reasoning_gym",
                    prompt_ids=prompt_ids,
                    completion_ids=_token_ids(rng, n, cfg.model.vocab_size),
                    loss_mask=[1] * n,
                    logprobs=(-rng.exponential(0.3, n)).tolist(),
                    versions=[version] * n,
                    finish_reason="stop" if n < max_tokens else "length",
                    prompt_text=prompt_text,
                    completion_text=_text(rng, n),
                    answer=str(int(rng.integers(0, 1000))),
                    rewards={"env": reward},
                    reward=reward,
                    info={"turn_rewards": [reward], "seed": int(rng.integers(0, 2**31)), "stop_reason": "done"},
                )
            )
    return samples


def grpo_advantages(samples: list[Sample], group_size: int) -> list[list[float]]:
    """Per-token GRPO advantages, as the orchestrator computed and sent them before issue 16."""
    out = []
    for start in range(0, len(samples), group_size):
        group = samples[start : start + group_size]
        rewards = np.array([s.reward for s in group])
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        out += [[float(a)] * len(s.completion_ids) for a, s in zip(advantages, group)]
    return out


def step_metrics() -> dict[str, float]:
    """A step's metrics dict, the size of the trainer's (the same in both replies)."""
    return {f"train/metric_{i}": float(i) / 7 for i in range(48)}


def trainer_reply(work, rng: np.random.Generator):
    """The fake trainer's answer to ``work``: its log-probs of each completion, in the message's own form."""
    logprobs = [(-rng.exponential(0.3, len(s.completion_ids))).astype(np.float32) for s in work.samples]
    if isinstance(work, OldTrainWork):
        return OldTrainDone(work.step, STEP + 1, step_metrics(), [lp.tolist() for lp in logprobs])
    from hetrl.control.protocol import TrainDone

    return TrainDone(work.step, STEP + 1, step_metrics(), logprobs)


# ------------------------------------------------------------------ the two ranks


def fake_trainer(world) -> None:
    """World rank 1: every trainer rank at once. Per trial: take the work messages, answer once."""
    from hetrl.control.comm import Tag, flush_sends, recv, send

    rng = np.random.default_rng(1)
    while (trial := recv(world, 0, Tag.CONTROL)[0]) is not None:
        send(world, "ready", 0, Tag.CONTROL)
        for _ in range(trial):
            work = recv(world, 0, Tag.WORK)[0]
        work_received = time.monotonic()
        reply = trainer_reply(work, rng)
        del work
        reply_sent = time.monotonic()
        send(world, reply, 0, Tag.RESULT)
        flush_sends()
        send(world, (work_received, reply_sent), 0, Tag.CONTROL)
    flush_sends()


def hand_over(world, work, num_sends: int) -> dict:
    """One step's hand-over from world rank 0: ``num_sends`` sends of ``work``, then the reply."""
    from hetrl.control.comm import Tag, recv, send

    send(world, num_sends, 1, Tag.CONTROL)
    recv(world, 1, Tag.CONTROL)  # the fake trainer is waiting for the work
    start = time.monotonic()
    for _ in range(num_sends):  # one send per trainer rank, as the old orchestrator did
        send(world, work, 1, Tag.WORK)
    reply = recv(world, 1, Tag.RESULT)[0]
    done = time.monotonic()
    work_received, reply_sent = recv(world, 1, Tag.CONTROL)[0]
    return {"send_s": work_received - start, "reply_s": done - reply_sent, "reply": reply}


def pickled_bytes(obj) -> int:
    """The bytes mpi4py puts on the wire for ``obj`` (its pickle, in mpi4py's protocol)."""
    from mpi4py import MPI

    return len(pickle.dumps(obj, MPI.pickle.PROTOCOL))


def measure(world, work, num_sends: int, repeats: int) -> dict:
    """Median phases over ``repeats`` hand-overs (after one warm-up) and the exact bytes."""
    hand_over(world, work, num_sends)
    runs = [hand_over(world, work, num_sends) for _ in range(repeats)]
    return {
        "send_s": statistics.median(r["send_s"] for r in runs),
        "reply_s": statistics.median(r["reply_s"] for r in runs),
        "num_sends": num_sends,
        "work_bytes": pickled_bytes(work),
        "reply_bytes": pickled_bytes(runs[-1]["reply"]),
    }


def per_step(measured: dict, num_sends: int) -> tuple[int, float]:
    """Orchestrator bytes and seconds per step of a hand-over of ``num_sends`` sends (the timed ones scaled)."""
    num_bytes = num_sends * measured["work_bytes"] + measured["reply_bytes"]
    return num_bytes, measured["send_s"] * num_sends / measured["num_sends"] + measured["reply_s"]


def orchestrator(world, args) -> None:
    from hetrl.control.comm import Tag, flush_sends, send
    from hetrl.control.protocol import TrainWork

    cfg, plans = recipe_plans()
    samples = synthetic_batch(cfg, args.length_scale)
    batch_bytes = pickled_bytes(samples)
    num_prompt = sum(len(s.prompt_ids) for s in samples) / len(samples)
    num_completion = sum(len(s.completion_ids) for s in samples) / len(samples)
    print(
        f"moe_grpo batch: {cfg.run.prompts_per_step} prompts x {cfg.algorithm.group_size} = {len(samples)} samples, "
        f"mean {num_prompt:.0f} prompt + {num_completion:.0f} completion tokens"
    )
    if args.length_scale > 1:
        print(
            f"lengths scaled 1/{args.length_scale} of full scale (~{num_prompt * args.length_scale:.0f} + "
            f"~{num_completion * args.length_scale:.0f}): at full scale bytes grow ~{args.length_scale}x and seconds "
            f"up to as much; the bytes ratios hardly change (--length-scale 1 for full scale)"
        )
    print(f"one batch pickled: {batch_bytes / 2**20:.1f} MiB")
    contender = {row["nodes"]: measure(world, TrainWork(STEP, samples), 1, args.repeats) for row in plans}
    old_work = OldTrainWork(STEP, samples, grpo_advantages(samples, cfg.algorithm.group_size))
    baseline = measure(world, old_work, args.baseline_sends, args.repeats)
    send(world, None, 1, Tag.CONTROL)
    flush_sends()
    report(plans, contender, baseline, batch_bytes, args)


def report(plans: list[dict], contender: dict, baseline: dict, batch_bytes: int, args) -> None:
    print(
        f"{'nodes':>6} {'trainer ranks':>13} {'hand-over':<9} {'sends':>6} {'MiB sent':>10} {'MiB recv':>9} "
        f"{'send s':>9} {'reply s':>8} {'total s':>9} {'bytes/batch':>12}"
    )
    ratios = {}
    for row in plans:
        n = len(row["trainer_ranks"])
        for name, measured, num_sends in (("new", contender[row["nodes"]], 1), ("old", baseline, n)):
            num_bytes, seconds = per_step(measured, num_sends)
            ratios[row["nodes"], name] = num_bytes / batch_bytes
            sent = num_sends * measured["work_bytes"]
            mark = "*" if name == "old" else " "
            print(
                f"{row['nodes']:>6} {n:>13} {name:<9} {num_sends:>6} {sent / 2**20:>10.1f} "
                f"{measured['reply_bytes'] / 2**20:>9.2f} "
                f"{seconds - measured['reply_s']:>8.3f}{mark} {measured['reply_s']:>8.3f} {seconds:>8.3f}{mark} "
                f"{ratios[row['nodes'], name]:>11.2f}x"
            )
    print(
        f"plans: {plans[0]['world']} / {plans[1]['world']} ranks, trainer leader world rank {plans[0]['leader']}, "
        f"orchestrator {plans[0]['orchestrator']} / {plans[1]['orchestrator']}; seconds: medians of {args.repeats}"
    )
    print(
        f"* old: {baseline['num_sends']} real sends timed, scaled to one per trainer rank "
        f"({baseline['send_s'] / baseline['num_sends'] * 1e3:.0f} ms per send); every one of them is in flight at "
        f"once, "
        f"{len(plans[1]['trainer_ranks']) * baseline['work_bytes'] / 2**30:.0f} GiB of pickles at {plans[1]['nodes']} "
        f"nodes"
    )
    print(f"control_plane: {ratios[HEADLINE_NODES, 'new']:.2f}x (goal <= {GOAL_RATIO:g})")


# ------------------------------------------------------------------ entry points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--length-scale",
        type=int,
        default=8,
        help="divide the recipe's token lengths by this (1: full scale, ~80 MiB a batch)",
    )
    parser.add_argument(
        "--baseline-sends", type=int, default=16, help="the old hand-over's sends timed for real (then scaled)"
    )
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)  # set on the ranks mpiexec starts
    args = parser.parse_args()
    if min(args.repeats, args.length_scale, args.baseline_sends) < 1:
        parser.error("--repeats, --length-scale and --baseline-sends must be >= 1")
    if not args.rank:
        from hetrl.launch.local import find_mpiexec

        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        script = str(Path(__file__).resolve())
        command = [find_mpiexec(), "-launcher", "fork", "-n", "2", sys.executable, script, "--rank", *sys.argv[1:]]
        sys.exit(subprocess.run(command, env=env).returncode)
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if world.Get_size() != 2:
        raise RuntimeError(
            f"run under mpiexec -n 2 (rank 0 orchestrator, rank 1 trainer), got {world.Get_size()} ranks"
        )
    if world.Get_rank() == 0:
        orchestrator(world, args)
    else:
        fake_trainer(world)


if __name__ == "__main__":
    main()
