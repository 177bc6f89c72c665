"""Rollout store write/read speed and size: SWMR HDF5 (contender) vs one JSON line per sample (baseline).

The store sits on the loop's critical path (append at every step), so it must keep up with
generation: the goal is >= 1000 samples/s of 128 prompt + 512 completion tokens on one core,
well above what a single node generates. Each variant runs REPEATS times on the same samples;
medians are reported. Write speed is given per wall second and per CPU second of this process:
on a shared machine the wall figure swings with load, the CPU figure is what a dedicated
controller core gets (the headline). Run: `python bench/rollout_store.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from hetrl.monitor.rollout_store import RolloutReader, RolloutStore  # noqa: E402
from hetrl.records import Sample  # noqa: E402

NUM_SAMPLES, PROMPT_LEN, COMPLETION_LEN, REPEATS, STEP_SIZE = 1024, 128, 512, 3, 256


def make_samples() -> tuple[list[Sample], list[list[float]]]:
    rng = np.random.default_rng(0)
    samples, trainer = [], []
    for i in range(NUM_SAMPLES):
        lp = rng.normal(-1, 0.5, COMPLETION_LEN).astype(np.float32)
        samples.append(
            Sample(
                sample_id=f"s{i}",
                group_id=f"g{i // 8}",
                task_name="countdown",
                prompt_ids=rng.integers(0, 150_000, PROMPT_LEN).tolist(),
                completion_ids=rng.integers(0, 150_000, COMPLETION_LEN).tolist(),
                loss_mask=[1] * COMPLETION_LEN,
                logprobs=lp.tolist(),
                versions=[3] * COMPLETION_LEN,
                prompt_text="x" * 400,
                completion_text="y" * 1600,
                rewards={"correct": 1.0, "format": 0.0},
                reward=1.0,
                info={"turn": 1},
            )
        )
        trainer.append((lp + 0.01).tolist())
    return samples, trainer


def bench_hdf5(directory: Path, samples, trainer) -> tuple[float, float, float, int]:
    start, cpu_start = time.perf_counter(), time.process_time()
    with RolloutStore(directory, flush_every=STEP_SIZE) as store:
        for k in range(0, NUM_SAMPLES, STEP_SIZE):
            store.append(k // STEP_SIZE, samples[k : k + STEP_SIZE], trainer[k : k + STEP_SIZE])
    write_s, write_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    start = time.perf_counter()
    rows = RolloutReader(directory).rows()
    worst = sorted(rows, key=lambda r: r.reward)[:5]
    RolloutReader(directory).load(worst)
    read_s = time.perf_counter() - start
    return write_s, write_cpu_s, read_s, sum(p.stat().st_size for p in directory.glob("*.h5"))


def bench_jsonl(directory: Path, samples, trainer) -> tuple[float, float, float, int]:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "rollouts.jsonl"
    start, cpu_start = time.perf_counter(), time.process_time()
    with path.open("w") as fh:
        for i, (s, lp) in enumerate(zip(samples, trainer)):
            fh.write(json.dumps({"step": i // STEP_SIZE, **asdict(s), "trainer_logprobs": lp}) + "\n")
            if (i + 1) % STEP_SIZE == 0:
                fh.flush()
    write_s, write_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    start = time.perf_counter()
    with path.open() as fh:
        rows = [json.loads(line) for line in fh]
    sorted(rows, key=lambda r: r["reward"])[:5]
    read_s = time.perf_counter() - start
    return write_s, write_cpu_s, read_s, path.stat().st_size


def main() -> None:
    samples, trainer = make_samples()
    results: dict[str, list[tuple[float, float, float, int]]] = {"hdf5": [], "jsonl": []}
    for rep in range(REPEATS):
        for name, fn in (("hdf5", bench_hdf5), ("jsonl", bench_jsonl)):
            tmp = Path(tempfile.mkdtemp(prefix=f"bench_{name}_{rep}_"))
            try:
                results[name].append(fn(tmp / "out", samples, trainer))
            finally:
                shutil.rmtree(tmp)
    med = {name: [statistics.median(r[i] for r in runs) for i in range(4)] for name, runs in results.items()}
    for name, (write_s, write_cpu_s, read_s, size) in med.items():
        print(
            f"{name:5s}: write {NUM_SAMPLES / write_s:7.0f} samples/s wall, {NUM_SAMPLES / write_cpu_s:7.0f} "
            f"samples/cpu-s"
            f"  scan+load-worst-5 {read_s * 1e3:7.1f} ms  size {size / 2**20:6.1f} MiB"
        )
    hdf5, jsonl = med["hdf5"], med["jsonl"]
    print(
        f"ratios hdf5/jsonl: write speed {jsonl[1] / hdf5[1]:.2f}x (cpu), read speed {jsonl[2] / hdf5[2]:.2f}x, size "
        f"{hdf5[3] / jsonl[3]:.2f}x"
    )
    print(f"rollout_store: {NUM_SAMPLES / hdf5[1]:.0f} samples/cpu-s (goal >= 1000 samples/cpu-s)")


if __name__ == "__main__":
    main()
