"""Browse a run's stored rollouts: ``python -m hetrl.browse RUN [filters]``.

Examples::

    python -m hetrl.browse runs/tiny --step 40 --worst 5         # the 5 lowest-reward samples of step 40
    python -m hetrl.browse runs/tiny --flag any                  # every flagged sample
    python -m hetrl.browse runs/tiny --flag format_violation --tokens   # + token-level engine/trainer log-probs
    python -m hetrl.browse runs/tiny --min-len 500 --json        # one JSON object per sample, for scripts
    python -m hetrl.browse runs/tiny_vlm_grpo --worst 3 --images shots/   # + each sample's images as PNG files

Works while the run is writing (the store is SWMR). Filters apply in this order: step, task, flag,
length, finish reason, reward, then ``--worst/--best`` by total reward
(:func:`hetrl.monitor.rollout_store.select_rows`, which ``python -m hetrl.view`` filters with too).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import numpy as np
from rich.console import Console
from rich.table import Table

from hetrl.models.images import to_pil, to_png
from hetrl.monitor.mismatch import mismatch_metrics, token_log_ratio
from hetrl.monitor.rollout_store import RolloutReader, RolloutRecord, RolloutRow, select_rows

# |log pi_trainer - log pi_engine| above this is highlighted in the token view: a ratio beyond
# ~exp(0.2) = 1.22 is where PPO-style clipping (0.2) starts to bite.
_HIGHLIGHT_DIFF = 0.2


def _summary_table(rows: Sequence[RolloutRow]) -> Table:
    table = Table("step", "sample_id", "task", "reward", "len", "finish", "flags", title=f"{len(rows)} rollouts")
    for r in rows:
        table.add_row(
            str(r.step), r.sample_id, r.task_name, f"{r.reward:.4g}", str(r.length), r.finish_reason, ",".join(r.flags)
        )
    return table


def token_table(record: RolloutRecord, max_tokens: int | None = None) -> Table:
    """Per-token engine vs trainer log-probs of one rollout; large differences in red."""
    s = record.sample
    table = Table(
        "pos", "token", "mask", "version", "engine_lp", "trainer_lp", "diff", title=f"tokens of {s.sample_id}"
    )
    diffs = token_log_ratio(s.logprobs, record.trainer_logprobs) if record.trainer_logprobs is not None else None
    limit = len(s.completion_ids) if max_tokens is None else min(max_tokens, len(s.completion_ids))
    for i in range(limit):
        trainer = "-" if diffs is None else f"{record.trainer_logprobs[i]:.5f}"
        diff = "-" if diffs is None else f"{diffs[i]:+.5f}"
        style = "bold red" if diffs is not None and s.loss_mask[i] and abs(diffs[i]) > _HIGHLIGHT_DIFF else None
        table.add_row(
            str(i),
            str(s.completion_ids[i]),
            str(s.loss_mask[i]),
            str(s.versions[i]),
            f"{s.logprobs[i]:.5f}",
            trainer,
            diff,
            style=style,
        )
    return table


def save_images(record: RolloutRecord, directory: Path) -> list[Path]:
    """Write a sample's images as ``DIR/<sample id>-<k>.png`` (k counts from 0, in token order)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, image in enumerate(record.sample.images):
        path = directory / f"{record.sample.sample_id}-{k}.png"
        path.write_bytes(to_png(image))
        paths.append(path)
    return paths


def _image_sizes(record: RolloutRecord) -> list[str]:
    return ["{}x{}".format(*to_pil(image).size) for image in record.sample.images]


def _print_record(
    console: Console, record: RolloutRecord, tokens: bool, max_tokens: int | None, image_dir: Path | None
) -> None:
    s = record.sample
    console.rule(f"step {record.step} · {s.sample_id} · task {s.task_name} · reward {s.reward:.4g}")
    console.print(
        f"rewards: {s.rewards}  flags: {s.flags}  finish: {s.finish_reason}  turns: {s.num_turns}  tool calls: "
        f"{s.num_tool_calls}"
    )
    policy_versions = [v for v in s.versions if v >= 0]
    console.print(
        f"weight versions: {min(policy_versions, default=-1)}..{max(policy_versions, default=-1)}  info: "
        f"{json.dumps(s.info, default=repr)}"
    )
    console.print("[bold]prompt:[/bold]", s.prompt_text or s.prompt_ids, markup=True, highlight=False)
    console.print("[bold]completion:[/bold]", s.completion_text or s.completion_ids, markup=True, highlight=False)
    if s.images:
        where = [str(p) for p in save_images(record, image_dir)] if image_dir else ["--images DIR saves them"]
        console.print(
            f"images: {len(s.images)} ({', '.join(_image_sizes(record))}): {', '.join(where)}", highlight=False
        )
    if record.trainer_logprobs is not None:
        m = mismatch_metrics([s.logprobs], [record.trainer_logprobs], [s.loss_mask])
        console.print("mismatch: " + "  ".join(f"{k}={v:.4g}" for k, v in m.items()))
    if tokens:
        console.print(token_table(record, max_tokens))


def record_json(record: RolloutRecord) -> dict:
    """A rollout as one JSON-ready dict (sample fields + step, trainer log-probs, per-token diff)."""
    s = record.sample
    out = {
        "step": record.step,
        "file": record.file,
        "index": record.index,
        **vars(s),
        "trainer_logprobs": record.trainer_logprobs,
        "images": _image_sizes(record),
    }  # their sizes: --images DIR writes the pictures
    if record.trainer_logprobs is not None:
        out["logprob_diff"] = np.round(token_log_ratio(s.logprobs, record.trainer_logprobs), 7).tolist()
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hetrl.browse", description="Browse the stored rollouts of a run.")
    p.add_argument("run", help="run directory (or a folder of rollout .h5 files)")
    p.add_argument("--step", type=int, help="only this RL step")
    p.add_argument("--task", help="only this task name")
    p.add_argument("--flag", help="only samples with this flag ('any': any flag)")
    p.add_argument("--min-len", type=int, help="minimum completion length (tokens)")
    p.add_argument("--max-len", type=int, help="maximum completion length (tokens)")
    p.add_argument("--finish", help="only samples with this finish reason (stop, length, ...)")
    p.add_argument("--min-reward", type=float, help="minimum total reward")
    p.add_argument("--max-reward", type=float, help="maximum total reward")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--worst", type=int, metavar="K", help="the K lowest-reward samples")
    group.add_argument("--best", type=int, metavar="K", help="the K highest-reward samples")
    p.add_argument("--tokens", action="store_true", help="show the token-level engine vs trainer log-prob table")
    p.add_argument("--max-tokens", type=int, default=200, help="rows of the token table per sample (default 200)")
    p.add_argument("--limit", type=int, default=10, help="samples shown in full after the summary (default 10)")
    p.add_argument("--json", action="store_true", help="print one JSON object per selected sample instead of tables")
    p.add_argument(
        "--images",
        type=Path,
        metavar="DIR",
        help="write the shown samples' images (screenshots, scenes) to DIR as PNG files",
    )
    return p


def main(argv: Sequence[str], out: IO[str] | None = None) -> int:
    args = _parser().parse_args(list(argv))
    out = out if out is not None else sys.stdout
    try:
        reader = RolloutReader(args.run)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rows = select_rows(
        reader.rows(args.step),
        task=args.task,
        flag=args.flag,
        min_len=args.min_len,
        max_len=args.max_len,
        finish=args.finish,
        min_reward=args.min_reward,
        max_reward=args.max_reward,
        worst=args.worst,
        best=args.best,
    )
    if args.json:
        for record in reader.load(rows):
            if args.images:
                save_images(record, args.images)
            out.write(json.dumps(record_json(record), default=repr) + "\n")
        return 0
    console = Console(file=out, width=None if out.isatty() else 160, highlight=False)
    console.print(_summary_table(rows))
    for record in reader.load(rows[: args.limit]):
        _print_record(console, record, args.tokens, args.max_tokens, args.images)
    if len(rows) > args.limit:
        console.print(f"... {len(rows) - args.limit} more (raise --limit or narrow the filters)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
