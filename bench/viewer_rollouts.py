"""The run viewer's Rollouts page on a large run: 1,000 steps x 1,024 samples (issue 36: under 2 s).

Builds the store once with the real writer (``RolloutStore``, as a run's orchestrator does; kept
in ``.bench/viewer_store`` for the next run), then times what the page
asks for when it opens, through the viewer's app (``hetrl.view.app``, in process over ASGI): the
HTML, the step list (``/api/steps``), the last step's groups with the first groups' previews
(``/api/step/N``) and one sample with its tokens (``/api/sample/N/ID``); and the same for a step
in the middle. Baseline beside it: what the page would cost if it read the whole store
(``RolloutReader.rows()``, what ``python -m hetrl.browse`` did before issue 36). Run: ``python
bench/viewer_rollouts.py [--steps 1000] [--samples 1024]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from hetrl.monitor.rollout_store import RolloutReader, RolloutStore  # noqa: E402
from hetrl.records import Sample  # noqa: E402
from hetrl.view.app import build_app  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPT_LEN, COMPLETION_LEN, GROUP = 48, 64, 8
GOAL_S = 2.0
REPEATS = 3


def _step_samples(step: int, n: int, rng: np.random.Generator) -> tuple[list[Sample], list[np.ndarray]]:
    samples, trainer = [], []
    for i in range(n):
        lp = rng.normal(-1.0, 0.5, COMPLETION_LEN).astype(np.float32)
        samples.append(
            Sample(
                sample_id=f"{step}.{i}",
                group_id=f"{step}.g{i // GROUP}",
                task_name="math" if i % 3 else "countdown",
                prompt_ids=rng.integers(0, 128, PROMPT_LEN).tolist(),
                completion_ids=rng.integers(0, 128, COMPLETION_LEN).tolist(),
                loss_mask=[1] * COMPLETION_LEN,
                logprobs=lp.tolist(),
                versions=[step] * COMPLETION_LEN,
                finish_reason="length" if i % 17 == 0 else "stop",
                prompt_text=f"What is {i} + {step}? Answer in <answer></answer> tags.",
                completion_text=f"<answer>{i + step}</answer>" + " thinking" * 6,
                answer=str(i + step),
                rewards={"math": float(i % 2)},
                reward=float(i % 2) + float(rng.normal(0, 0.1)),
                flags=["format_violation"] if i % 11 == 0 else [],
            )
        )
        trainer.append(lp + rng.normal(0, 0.01, COMPLETION_LEN).astype(np.float32))
    return samples, trainer


def build_store(run: Path, steps: int, samples: int) -> None:
    """The store of a run of ``steps`` x ``samples``, written as a run writes it (one part, flush every 256)."""
    done = run / "complete"
    if done.is_file() and done.read_text() == f"{steps}x{samples}":
        return
    for old in (run / "rollouts").glob("*.h5*"):
        old.unlink()
    # One step's samples appended at every step (their sample ids repeat across steps, never within
    # one): building a million Sample objects would time the generator, not the store.
    batch, trainer = _step_samples(0, samples, np.random.default_rng(0))
    t0 = time.perf_counter()
    with RolloutStore(run / "rollouts") as store:
        for step in range(steps):
            store.append(step, batch, trainer)
            if step % 100 == 99:
                print(f"  wrote {step + 1} steps ({time.perf_counter() - t0:.0f} s)", flush=True)
    done.write_text(f"{steps}x{samples}")


def open_rollouts_page(client: TestClient, step: int) -> float:
    """Seconds to fetch what the Rollouts page fetches when it opens at ``step`` (and one sample of it)."""
    t0 = time.perf_counter()
    assert client.get("/rollouts").status_code == 200
    steps = client.get("/api/steps").json()["steps"]
    assert str(step) in steps, steps.keys()
    groups = client.get(f"/api/step/{step}").json()["groups"]
    sample = client.get(f"/api/sample/{step}/{groups[0]['samples'][0]['sample_id']}").json()
    assert len(sample["tokens"]) == COMPLETION_LEN, sample.get("missing")
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--run", type=Path, default=ROOT / ".bench" / "viewer_store")
    args = parser.parse_args()
    build_store(args.run, args.steps, args.samples)
    size_mib = sum(p.stat().st_size for p in (args.run / "rollouts").glob("*.h5")) / 2**20
    print(f"store: {args.steps} steps x {args.samples} samples, {size_mib:.0f} MiB")
    client = TestClient(build_app(args.run))
    open_rollouts_page(client, 0)  # first call: the app's lazy imports (torch for the advantages, the tokenizer)
    last = [open_rollouts_page(client, args.steps - 1) for _ in range(REPEATS)]
    middle = [open_rollouts_page(client, args.steps // 2) for _ in range(REPEATS)]
    t0 = time.perf_counter()
    num_rows = len(RolloutReader(args.run).rows())
    whole = time.perf_counter() - t0
    print(
        f"opening at the last step: {' '.join(f'{s:.2f}' for s in last)} s; at step {args.steps // 2}: "
        f"{' '.join(f'{s:.2f}' for s in middle)} s"
    )
    print(f"baseline: reading every row of the store ({num_rows:,} rows): {whole:.2f} s")
    worst = max(statistics.median(last), statistics.median(middle))
    print(f"viewer_rollouts: {worst:.2f} s to open the Rollouts page (goal < {GOAL_S:.0f} s)")


if __name__ == "__main__":
    main()
