"""Planning + rendering time for a 1024-node MoE job: `python bench/plan.py`.

Contender: the placement planner + sbatch renderer for `moe_grpo nodes=1024` (what --dry-run does,
minus printing). Baseline: loading and validating the same recipe alone, so the ratio says what
planning adds on top of reading the config. Headline: the median planning + rendering time, against
the 2 s the dry-run must fit in.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from hetrl.config import load_config  # noqa: E402
from hetrl.control.plan import make_plan  # noqa: E402
from hetrl.launch.sbatch import render_sbatch  # noqa: E402

REPEATS = 15


def median_s(fn) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    overrides = ["nodes=1024"]
    run_dir = Path(tempfile.mkdtemp()) / "moe_grpo"
    cfg = load_config("moe_grpo", overrides)
    load_s = median_s(lambda: load_config("moe_grpo", overrides))
    plan_s = median_s(lambda: make_plan(cfg))
    plan = make_plan(cfg)
    render_s = median_s(lambda: render_sbatch(plan, cfg.cluster, run_dir, job_name=cfg.run.name))
    total = load_s + plan_s + render_s
    print(f"ranks planned: {plan.world_size} in {len(plan.components)} components")
    print(
        f"load+validate {load_s * 1e3:.1f} ms | plan {plan_s * 1e3:.1f} ms | render {render_s * 1e3:.2f} ms (medians "
        f"of {REPEATS})"
    )
    print(f"planning+rendering over config loading alone: {(plan_s + render_s) / load_s:.2f}x")
    print(f"plan: {total * 1e3:.0f}ms (goal < 2000ms)")


if __name__ == "__main__":
    main()
