"""The HDF5 rollout store: exact round trip, bounded memory, reads while another process writes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from monitor_synth import make_samples

from hetrl.monitor.rollout_store import RolloutReader, RolloutStore


def _assert_equal(records, expected_steps):
    expected = [(step, s, lp) for step in expected_steps for s, lp in zip(*make_samples(step))]
    assert len(records) == len(expected)
    for rec, (step, sample, lp) in zip(records, expected):
        assert rec.step == step
        assert rec.sample == sample  # dataclass equality: every field, incl. float32-exact log-probs
        assert rec.trainer_logprobs == lp


def test_round_trip_equal(tmp_path):
    with RolloutStore(tmp_path, flush_every=4) as store:
        for step in range(3):
            samples, lp = make_samples(step)
            store.append(step, samples, trainer_logprobs=lp)
    _assert_equal(RolloutReader(tmp_path).records(), range(3))
    assert [r.sample.sample_id for r in RolloutReader(tmp_path).records(step=1)] == [
        s.sample_id for s in make_samples(1)[0]
    ]


def test_a_store_written_before_routing_replay_still_reads(tmp_path):
    import h5py

    with RolloutStore(tmp_path) as store:
        store.append(0, *make_samples(0))
    [path] = RolloutReader(tmp_path).files()
    with h5py.File(path, "a") as f:  # what the v1 format wrote: no routing columns
        for name in ("ragged/routed_experts", "samples/routing_layers", "samples/routing_topk"):
            del f[name]
    records = RolloutReader(tmp_path).records()
    assert [r.sample for r in records] == make_samples(0)[0] and all(r.sample.routed_experts is None for r in records)


def test_without_trainer_logprobs_and_bounded_buffer(tmp_path):
    store = RolloutStore(tmp_path, flush_every=5)
    samples, _ = make_samples(0, n=12)
    store.append(0, samples[:4])
    assert store._pending and len(RolloutReader(tmp_path).rows()) == 0  # below flush_every: buffered only
    store.append(0, samples[4:])
    assert len(store._pending) == 0  # reached flush_every: written, memory released
    assert len(RolloutReader(tmp_path).rows()) == 12
    store.close()
    records = RolloutReader(tmp_path).records()
    assert all(r.trainer_logprobs is None for r in records)
    assert [r.sample for r in records] == samples


def test_rejects_misaligned_trainer_logprobs(tmp_path):
    samples, lp = make_samples(0, n=2)
    with RolloutStore(tmp_path) as store:
        with pytest.raises(ValueError, match="trainer log-probs"):
            store.append(0, samples, trainer_logprobs=[lp[0][:-1], lp[1]])
        with pytest.raises(ValueError, match="for 1 samples"):
            store.append(0, samples, trainer_logprobs=lp[:1])


def test_restart_opens_next_part(tmp_path):
    for step in range(2):
        with RolloutStore(tmp_path) as store:
            samples, lp = make_samples(step)
            store.append(step, samples, lp)
    assert [p.name for p in RolloutReader(tmp_path).files()] == ["rollouts-0000.h5", "rollouts-0001.h5"]
    _assert_equal(RolloutReader(tmp_path).records(), range(2))


WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from monitor_synth import make_samples
    from hetrl.monitor.rollout_store import RolloutStore
    d = Path({d!r})
    store = RolloutStore(d / "rollouts", flush_every=10_000)
    for step in range({steps}):
        samples, lp = make_samples(step)
        store.append(step, samples, lp)
        store.flush()
        (d / f"ready{{step}}").touch()
        while not (d / f"ack{{step}}").exists():
            time.sleep(0.01)
    store.close()
""")


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"writer exited early: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {path}")
        time.sleep(0.01)


def test_read_while_another_process_writes(tmp_path):
    steps = 3
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    code = WRITER.format(tests=str(Path(__file__).parent), d=str(tmp_path), steps=steps)
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)
    try:
        for step in range(steps):
            _wait_for(tmp_path / f"ready{step}", proc)
            assert proc.poll() is None  # the writer still holds the file open
            _assert_equal(RolloutReader(tmp_path).records(), range(step + 1))
            (tmp_path / f"ack{step}").touch()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    _assert_equal(RolloutReader(tmp_path).records(), range(steps))


def test_flushed_rollouts_survive_a_killed_writer(tmp_path):
    """A run killed mid-write (OOM, pre-emption) keeps every flushed step readable."""
    code = WRITER.format(tests=str(Path(__file__).parent), d=str(tmp_path), steps=3)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for(tmp_path / "ready0", proc)
        (tmp_path / "ack0").touch()
        _wait_for(tmp_path / "ready1", proc)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    _assert_equal(RolloutReader(tmp_path).records(), range(2))


def test_images_round_trip_as_png(tmp_path):
    """Multimodal samples keep their images (PNG bytes on disk, pixel-exact), and a v2 file reads as image-free."""
    import dataclasses

    import h5py
    import numpy as np
    from PIL import Image

    from hetrl.models.images import to_pil

    samples, lp = make_samples(0)
    pictures = [Image.new("RGB", (16 + 8 * k, 12), (40 * k, 200, 30)) for k in range(3)]
    noise = Image.fromarray(np.random.default_rng(0).integers(0, 255, (20, 24, 3), dtype=np.uint8))
    samples = [
        dataclasses.replace(samples[0], images=pictures),
        dataclasses.replace(samples[1], images=[noise]),
        *samples[2:],
    ]
    with RolloutStore(tmp_path, flush_every=2) as store:
        store.append(0, samples, trainer_logprobs=lp)
    records = RolloutReader(tmp_path).records()
    assert [len(r.sample.images) for r in records] == [len(s.images) for s in samples]
    for record, sample in zip(records, samples):
        assert all(isinstance(image, bytes) for image in record.sample.images)
        for stored, original in zip(record.sample.images, sample.images):
            assert np.array_equal(np.asarray(to_pil(stored)), np.asarray(original))
        assert dataclasses.replace(record.sample, images=[]) == dataclasses.replace(sample, images=[])

    [path] = RolloutReader(tmp_path).files()
    with h5py.File(path, "a") as f:  # what the v2 format wrote: no image fields
        del f["ragged/image_bytes"], f["ragged/image_lengths"]
    assert all(r.sample.images == [] for r in RolloutReader(tmp_path).records())


def test_one_step_reads_as_the_whole_store_filtered(tmp_path):
    for part in range(2):  # two files: a restarted run's parts
        with RolloutStore(tmp_path, flush_every=5) as store:
            for step in range(3 * part, 3 * part + 3):
                store.append(step, *make_samples(step))
    reader = RolloutReader(tmp_path)
    assert reader.step_counts() == {step: 6 for step in range(6)}
    for step in (0, 2, 4, 5):
        assert reader.rows(step) == [r for r in reader.rows() if r.step == step]
    assert reader.rows(99) == []
    _assert_equal(reader.records(step=4), [4])
