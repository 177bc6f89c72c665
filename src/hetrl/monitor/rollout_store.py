"""Every rollout of a run, appended to HDF5 files that stay readable while the run writes them.

Contract. One :class:`RolloutStore` (one writing process) owns one file
``DIR/<name>-<part>.h5``; a restarted run opens the next part, never reopens an old file. Readers
(:class:`RolloutReader`, ``python -m hetrl.browse``) may open the files at any time, from any
process, while the writer appends.

Why the layout is flat. Concurrent reading uses HDF5's single-writer/multiple-reader (SWMR) mode,
which forbids creating objects after the switch and does not support variable-length types. So all
datasets are created up front as 1-D, chunked, unlimited arrays of fixed-size types: per-sample
columns under ``/samples`` and, for every ragged field (token lists and UTF-8 strings), a flat
``values`` array plus a per-sample cumulative ``end`` offset under ``/ragged/<field>`` (images too:
their PNG bytes end to end, and each image's byte length). A flush
writes the ragged values first, then the offsets, then the per-sample columns, ``step`` last:
``len(step)`` is the commit mark, so a reader that refreshes ``step`` first never sees a sample
whose data are not yet visible.

Bounded memory: samples are buffered until ``flush_every`` of them are pending, then written and
dropped from RAM. Log-probs are stored as float32, exactly what engines and trainers compute them
in, so they read back bit-identical.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from hetrl.models.images import to_png
from hetrl.records import Sample

# ragged field -> (dtype, the field whose offsets it shares). Completion-aligned per-token lists
# share one offset array: they have len(completion_ids) entries by the Sample contract.
_TOKEN_FIELDS: dict[str, tuple[type, str]] = {
    "prompt_ids": (np.int32, "prompt_ids"),
    "completion_ids": (np.int32, "completion_ids"),
    "loss_mask": (np.int8, "completion_ids"),
    "engine_logprobs": (np.float32, "completion_ids"),
    "trainer_logprobs": (np.float32, "completion_ids"),
    "versions": (np.int32, "completion_ids"),
    # Routing replay (MoE): the engine's experts, [rows, layers, top_k] flattened (shape in the
    # routing_layers / routing_topk columns; 0 rows without routing).
    "routed_experts": (np.uint16, "routed_experts"),
    # Images (multimodal episodes): each image's PNG bytes, concatenated, and each image's byte length.
    "image_bytes": (np.uint8, "image_bytes"),
    "image_lengths": (np.int64, "image_lengths"),
}
_STRING_FIELDS = (
    "sample_id",
    "group_id",
    "task_name",
    "finish_reason",
    "prompt_text",
    "completion_text",
    "rewards_json",
    "flags_json",
    "info_json",
    "answer_json",
)
_COLUMNS: dict[str, type] = {
    "reward": np.float64,
    "num_turns": np.int32,
    "num_tool_calls": np.int32,
    "has_trainer_logprobs": np.int8,
    "min_version": np.int32,
    "max_version": np.int32,
    "routing_layers": np.int16,
    "routing_topk": np.int16,
    "step": np.int64,  # the commit mark (see module docstring), written after everything else
}
_OFFSET_FIELDS = ("prompt_ids", "completion_ids", "routed_experts", "image_bytes", "image_lengths", *_STRING_FIELDS)
_VALUE_CHUNK = 1 << 16
_COLUMN_CHUNK = 1 << 10
# Rows asked for together and at most this far apart are read in one window: reading the rows
# between costs less than another read (a read decompresses whole chunks anyway).
_WINDOW_GAP = 1024
ROLLOUT_DIR = "rollouts"


def _to_json(value: Any) -> str:
    # Env info and answers are arbitrary task objects: keep what JSON can hold, repr() the rest,
    # because a monitoring write must never take down the rollout loop.
    return json.dumps(value, default=repr, ensure_ascii=False)


class RolloutStore:
    """Appends samples (with trainer log-probs when known) to one SWMR HDF5 file."""

    def __init__(
        self, directory: str | os.PathLike, name: str = "rollouts", flush_every: int = 256, compression: int = 1
    ):
        if flush_every < 1:
            raise ValueError(f"flush_every must be >= 1, got {flush_every}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.flush_every = flush_every
        self.path = self._next_part(name)
        self._pending: list[tuple[int, Sample, list[float] | None]] = []
        self._num_written = 0
        self._file = self._create(compression)

    def _next_part(self, name: str) -> Path:
        part = 0
        while (self.directory / f"{name}-{part:04d}.h5").exists():
            part += 1
        return self.directory / f"{name}-{part:04d}.h5"

    def _create(self, compression: int) -> h5py.File:
        # Built under a temporary name and renamed once in SWMR mode: a reader globbing *.h5 can
        # never catch the file before SWMR is on (it would fail to open it).
        tmp = self.path.with_suffix(".h5.tmp")
        f = h5py.File(tmp, "w", libver="latest")
        opts: dict[str, Any] = {"compression": "gzip", "compression_opts": compression} if compression else {}
        for field_name in _COLUMNS:
            f.create_dataset(
                f"samples/{field_name}",
                (0,),
                maxshape=(None,),
                dtype=_COLUMNS[field_name],
                chunks=(_COLUMN_CHUNK,),
                **opts,
            )
        for field_name in _OFFSET_FIELDS:
            f.create_dataset(
                f"ragged/{field_name}/end", (0,), maxshape=(None,), dtype=np.int64, chunks=(_COLUMN_CHUNK,), **opts
            )
        for field_name, (dtype, _) in _TOKEN_FIELDS.items():
            f.create_dataset(
                f"ragged/{field_name}/values", (0,), maxshape=(None,), dtype=dtype, chunks=(_VALUE_CHUNK,), **opts
            )
        for field_name in _STRING_FIELDS:
            f.create_dataset(
                f"ragged/{field_name}/values", (0,), maxshape=(None,), dtype=np.uint8, chunks=(_VALUE_CHUNK,), **opts
            )
        f.attrs["format"] = "hetrl-rollouts-v3"  # v2: routed_experts; v3: images
        f.swmr_mode = True
        # Handles cached: h5py's path lookup per access dominated small flushes.
        self._datasets = {
            **{f"samples/{k}": f[f"samples/{k}"] for k in _COLUMNS},
            **{f"ragged/{k}/end": f[f"ragged/{k}/end"] for k in _OFFSET_FIELDS},
            **{f"ragged/{k}/values": f[f"ragged/{k}/values"] for k in (*_TOKEN_FIELDS, *_STRING_FIELDS)},
        }
        self._ends = dict.fromkeys(_OFFSET_FIELDS, 0)
        os.replace(tmp, self.path)
        return f

    @property
    def num_samples(self) -> int:
        """Samples appended so far (written or pending)."""
        return self._num_written + len(self._pending)

    def append(
        self, step: int, samples: list[Sample], trainer_logprobs: Sequence[Sequence[float]] | None = None
    ) -> None:
        """Queue one step's samples; ``trainer_logprobs[i]`` aligns with ``samples[i].completion_ids``."""
        if self._file is None:
            raise RuntimeError(f"rollout store {self.path} is closed")
        if trainer_logprobs is not None:
            if len(trainer_logprobs) != len(samples):
                raise ValueError(f"got trainer log-probs for {len(trainer_logprobs)} samples, expected {len(samples)}")
            for s, lp in zip(samples, trainer_logprobs):
                if len(lp) != len(s.completion_ids):
                    raise ValueError(
                        f"sample {s.sample_id}: {len(lp)} trainer log-probs for {len(s.completion_ids)} completion "
                        f"tokens"
                    )
        for i, s in enumerate(samples):
            self._pending.append((int(step), s, None if trainer_logprobs is None else list(trainer_logprobs[i])))
        if len(self._pending) >= self.flush_every:
            self.flush()

    def _encode(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Pending samples as (ragged values, per-sample lengths, per-sample columns)."""
        values: dict[str, list[np.ndarray]] = {k: [] for k in (*_TOKEN_FIELDS, *_STRING_FIELDS)}
        columns: dict[str, list[Any]] = {k: [] for k in _COLUMNS}
        for step, s, trainer_lp in self._pending:
            n = len(s.completion_ids)
            pngs = [to_png(image) for image in s.images]
            tokens = {
                "prompt_ids": s.prompt_ids,
                "completion_ids": s.completion_ids,
                "loss_mask": s.loss_mask,
                "engine_logprobs": s.logprobs,
                "versions": s.versions,
                "trainer_logprobs": trainer_lp if trainer_lp is not None else np.full(n, np.nan),
                "routed_experts": s.routed_experts if s.routed_experts is not None else np.zeros(0),
                "image_bytes": np.frombuffer(b"".join(pngs), dtype=np.uint8),
                "image_lengths": [len(png) for png in pngs],
            }
            for k, (dtype, _) in _TOKEN_FIELDS.items():
                values[k].append(np.asarray(tokens[k], dtype=dtype).reshape(-1))
            strings = {
                "sample_id": s.sample_id,
                "group_id": s.group_id,
                "task_name": s.task_name,
                "finish_reason": s.finish_reason,
                "prompt_text": s.prompt_text,
                "completion_text": s.completion_text,
                "rewards_json": _to_json(s.rewards),
                "flags_json": _to_json(list(s.flags)),
                "info_json": _to_json(s.info),
                "answer_json": _to_json(s.answer),
            }
            for k in _STRING_FIELDS:
                values[k].append(np.frombuffer(strings[k].encode("utf-8"), dtype=np.uint8))
            versions = [v for v in s.versions if v >= 0]
            row = {
                "step": step,
                "reward": s.reward,
                "num_turns": s.num_turns,
                "num_tool_calls": s.num_tool_calls,
                "has_trainer_logprobs": trainer_lp is not None,
                "min_version": min(versions, default=-1),
                "max_version": max(versions, default=-1),
                "routing_layers": 0 if s.routed_experts is None else s.routed_experts.shape[1],
                "routing_topk": 0 if s.routed_experts is None else s.routed_experts.shape[2],
            }
            for k in _COLUMNS:
                columns[k].append(row[k])
        lengths = {k: np.array([len(v) for v in values[k]], dtype=np.int64) for k in _OFFSET_FIELDS}
        flat = {
            k: np.concatenate(v) if v else np.zeros(0, _TOKEN_FIELDS.get(k, (np.uint8,))[0]) for k, v in values.items()
        }
        cols = {k: np.asarray(v, dtype=_COLUMNS[k]) for k, v in columns.items()}
        return flat, lengths, cols

    @staticmethod
    def _extend(ds: h5py.Dataset, data: np.ndarray) -> None:
        start = ds.shape[0]
        ds.resize((start + data.shape[0],))
        ds[start:] = data

    def flush(self) -> None:
        """Write pending samples and make them visible to readers."""
        if not self._pending or self._file is None:
            return
        flat, lengths, cols = self._encode()
        ds = self._datasets
        for k, data in flat.items():
            self._extend(ds[f"ragged/{k}/values"], data)
        for k, lens in lengths.items():
            end = ds[f"ragged/{k}/end"]
            base = int(self._ends[k])
            self._extend(end, base + np.cumsum(lens))
            self._ends[k] = base + int(lens.sum())
        for k in _COLUMNS:
            if k != "step":
                self._extend(ds[f"samples/{k}"], cols[k])
        # One file-level flush publishes everything above; only then the commit mark (see module
        # docstring).
        self._file.flush()
        self._extend(ds["samples/step"], cols["step"])
        ds["samples/step"].flush()
        self._num_written += len(self._pending)
        self._pending.clear()

    def close(self) -> None:
        """Flush and close; further appends raise."""
        if self._file is not None:
            self.flush()
            self._file.close()
            self._file = None

    def __enter__(self) -> RolloutStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class RolloutRecord:
    """One stored rollout, as read back (``trainer_logprobs`` is None when none were given)."""

    step: int
    sample: Sample
    trainer_logprobs: list[float] | None
    file: str
    index: int


@dataclass
class RolloutRow:
    """The cheap columns of one stored rollout, enough to filter before loading tokens."""

    file: str
    index: int
    step: int
    sample_id: str
    task_name: str
    reward: float
    length: int
    flags: list[str]
    finish_reason: str
    group_id: str


def select_rows(
    rows: Sequence[RolloutRow],
    step: int | None = None,
    task: str | None = None,
    flag: str | None = None,
    min_len: int | None = None,
    max_len: int | None = None,
    finish: str | None = None,
    min_reward: float | None = None,
    max_reward: float | None = None,
    worst: int | None = None,
    best: int | None = None,
) -> list[RolloutRow]:
    """Filter rollout rows (``hetrl.browse``'s and ``hetrl.view``'s filters); ``flag='any'`` keeps every
    flagged row; worst/best keep the K lowest/highest rewards of what the other filters kept."""
    if worst is not None and best is not None:
        raise ValueError("--worst and --best are exclusive")
    out = [
        r
        for r in rows
        if (step is None or r.step == step)
        and (task is None or r.task_name == task)
        and (flag is None or (bool(r.flags) if flag == "any" else flag in r.flags))
        and (min_len is None or r.length >= min_len)
        and (max_len is None or r.length <= max_len)
        and (finish is None or r.finish_reason == finish)
        and (min_reward is None or r.reward >= min_reward)
        and (max_reward is None or r.reward <= max_reward)
    ]
    if worst is not None:
        out = sorted(out, key=lambda r: r.reward)[:worst]
    if best is not None:
        out = sorted(out, key=lambda r: -r.reward)[:best]
    return out


@dataclass
class _Window:
    """Rows lo.. of one file, read into memory: per-sample columns, and each ragged field's values
    with the offsets that cut them (``bounds[k][j]`` is where row lo + j starts, in the file)."""

    lo: int
    bounds: dict[str, np.ndarray]
    values: dict[str, np.ndarray]
    cols: dict[str, np.ndarray]

    def ragged(self, field_name: str, index: int) -> np.ndarray:
        b = self.bounds[_TOKEN_FIELDS[field_name][1] if field_name in _TOKEN_FIELDS else field_name]
        j, first = index - self.lo, int(b[0])
        return self.values[field_name][int(b[j]) - first : int(b[j + 1]) - first]


class _OpenFile:
    """One file opened for SWMR reading with its commit count fixed at open time."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.f = h5py.File(path, "r", libver="latest", swmr=True)
        except (OSError, RuntimeError) as err:  # h5py's error for a file cut short or not HDF5 at all
            raise ValueError(f"cannot open {path}: {err}") from err
        self._open: dict[str, h5py.Dataset | None] = {}
        step = self._ds("samples/step")
        if step is None:
            self.f.close()
            raise ValueError(f"{path} is not a hetrl rollout file (it has no samples/step)")
        self.num = int(step.shape[0])

    def _ds(self, name: str) -> h5py.Dataset | None:
        """A dataset refreshed to what the writer has flushed (refreshed after ``samples/step``, the commit
        mark, so it holds at least ``num`` rows), or None in a file written before it existed. Opened
        on first use: a reader of one step's cheap columns touches 8 of the ~45 datasets."""
        if name not in self._open:
            ds = self.f.get(name)
            if ds is not None:
                ds.refresh()
            self._open[name] = ds
        return self._open[name]

    # A file written before a field existed (v1 had no routing) reads as if every row left it empty.
    # Every read takes a window of rows [lo, hi): a viewer of a run with a million samples reads
    # only the rows it shows.

    def column(self, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        hi = self.num if hi is None else hi
        ds = self._ds(f"samples/{name}")
        return np.zeros(hi - lo, dtype=_COLUMNS[name]) if ds is None else ds[lo:hi]

    def bounds(self, field_name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Where rows lo..hi-1 of a ragged field start, and where the last one ends (hi - lo + 1 offsets)."""
        hi = self.num if hi is None else hi
        ds = self._ds(f"ragged/{field_name}/end")
        if ds is None:
            return np.zeros(hi - lo + 1, dtype=np.int64)
        end = ds[max(lo - 1, 0) : hi]
        return end if lo else np.concatenate([np.zeros(1, np.int64), end])

    def window(self, lo: int, hi: int) -> _Window:
        """Rows lo..hi-1 of every field, read with one slice per dataset (h5py pays per read, and a
        read decompresses whole chunks: row by row, a step of 1,024 samples took seconds)."""
        bounds = {k: self.bounds(k, lo, hi) for k in _OFFSET_FIELDS}
        values = {}
        for k in (*_TOKEN_FIELDS, *_STRING_FIELDS):
            b = bounds[_TOKEN_FIELDS[k][1] if k in _TOKEN_FIELDS else k]
            dtype = _TOKEN_FIELDS[k][0] if k in _TOKEN_FIELDS else np.uint8
            ds = self._ds(f"ragged/{k}/values")
            values[k] = np.zeros(0, dtype) if ds is None else ds[int(b[0]) : int(b[-1])]
        return _Window(lo, bounds, values, {k: self.column(k, lo, hi) for k in _COLUMNS})

    def strings(self, field_name: str, lo: int = 0, hi: int | None = None) -> list[str]:
        b = self.bounds(field_name, lo, hi)
        blob = self._ds(f"ragged/{field_name}/values")[int(b[0]) : int(b[-1])].tobytes()
        b = b - b[0]
        return [blob[x:y].decode("utf-8") for x, y in zip(b[:-1], b[1:])]

    def close(self) -> None:
        self.f.close()


class RolloutReader:
    """Reads the rollout files of a run (``RUN/rollouts``) or of one directory of ``*.h5`` files."""

    def __init__(self, path: str | os.PathLike):
        path = Path(path)
        self.directory = path / ROLLOUT_DIR if (path / ROLLOUT_DIR).is_dir() else path
        if not self.directory.is_dir():
            raise FileNotFoundError(
                f"no rollout directory at {path} (expected RUN/{ROLLOUT_DIR}/ or a folder of .h5 files)"
            )

    def files(self) -> list[Path]:
        return sorted(self.directory.glob("*.h5"))

    def step_counts(self) -> dict[int, int]:
        """Committed rollouts per RL step, in step order: reads the step column alone."""
        counts: dict[int, int] = {}
        for path in self.files():
            of = _OpenFile(path)
            try:
                steps, num = np.unique(of.column("step"), return_counts=True)
            finally:
                of.close()
            for step, n in zip(steps.tolist(), num.tolist()):
                counts[step] = counts.get(step, 0) + n
        return dict(sorted(counts.items()))

    def rows(self, step: int | None = None) -> list[RolloutRow]:
        """Every committed rollout's cheap columns (of one step when given), in file then append order.

        A step's rows are read as one window of each file (a step's samples are written together),
        so one step of a long run costs what that step holds, not what the run holds."""
        out: list[RolloutRow] = []
        for path in self.files():
            of = _OpenFile(path)
            try:
                steps = of.column("step")
                picked = np.arange(of.num) if step is None else np.flatnonzero(steps == step)
                if not len(picked):
                    continue
                lo, hi = int(picked[0]), int(picked[-1]) + 1
                rewards = of.column("reward", lo, hi)
                lengths = np.diff(of.bounds("completion_ids", lo, hi))
                ids, tasks, flags, finish, groups = (
                    of.strings(k, lo, hi) for k in ("sample_id", "task_name", "flags_json", "finish_reason", "group_id")
                )
                for i in picked.tolist():
                    j = i - lo
                    out.append(
                        RolloutRow(
                            str(path),
                            i,
                            int(steps[i]),
                            ids[j],
                            tasks[j],
                            float(rewards[j]),
                            int(lengths[j]),
                            json.loads(flags[j]),
                            finish[j],
                            groups[j],
                        )
                    )
            finally:
                of.close()
        return out

    def load(self, rows: list[RolloutRow]) -> list[RolloutRecord]:
        """Full records for the given rows (in the same order). Rows near each other in a file are read
        as one window (:meth:`_OpenFile.window`); rows far apart, in windows of their own."""
        by_file: dict[str, list[int]] = {}
        for pos, row in enumerate(rows):
            by_file.setdefault(row.file, []).append(pos)
        out: list[RolloutRecord | None] = [None] * len(rows)
        for file, positions in by_file.items():
            of = _OpenFile(Path(file))
            try:
                for cluster in _clusters(sorted(positions, key=lambda pos: rows[pos].index), rows):
                    window = of.window(rows[cluster[0]].index, rows[cluster[-1]].index + 1)
                    for pos in cluster:
                        out[pos] = _read_record(of.path, rows[pos].index, window)
            finally:
                of.close()
        return [r for r in out if r is not None]

    def records(self, step: int | None = None) -> list[RolloutRecord]:
        """All records (of one step when given)."""
        return self.load(self.rows(step))


def _routing(flat: np.ndarray, cols: dict[str, np.ndarray], i: int) -> np.ndarray | None:
    layers, topk = int(cols["routing_layers"][i]), int(cols["routing_topk"][i])
    return flat.reshape(-1, layers, topk) if layers else None


def _images(blob: np.ndarray, lengths: np.ndarray) -> list[bytes]:
    """A sample's images as PNG bytes, split by their byte lengths."""
    data, bounds = blob.tobytes(), np.concatenate([[0], np.cumsum(lengths)])
    return [data[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _clusters(positions: list[int], rows: list[RolloutRow]) -> list[list[int]]:
    """Positions (sorted by row index) cut where two rows lie more than :data:`_WINDOW_GAP` rows apart."""
    out: list[list[int]] = []
    for pos in positions:
        if out and rows[pos].index - rows[out[-1][-1]].index <= _WINDOW_GAP:
            out[-1].append(pos)
        else:
            out.append([pos])
    return out


def _read_record(path: Path, i: int, window: _Window) -> RolloutRecord:
    """Row ``i`` of the file at ``path``, from a window that holds it."""
    text = {k: window.ragged(k, i).tobytes().decode("utf-8") for k in _STRING_FIELDS}
    tok = {k: window.ragged(k, i) for k in _TOKEN_FIELDS}
    cols, j = window.cols, i - window.lo
    sample = Sample(
        sample_id=text["sample_id"],
        group_id=text["group_id"],
        task_name=text["task_name"],
        prompt_ids=tok["prompt_ids"].tolist(),
        completion_ids=tok["completion_ids"].tolist(),
        loss_mask=tok["loss_mask"].tolist(),
        logprobs=tok["engine_logprobs"].tolist(),
        versions=tok["versions"].tolist(),
        finish_reason=text["finish_reason"],
        prompt_text=text["prompt_text"],
        completion_text=text["completion_text"],
        answer=json.loads(text["answer_json"]),
        rewards=json.loads(text["rewards_json"]),
        reward=float(cols["reward"][j]),
        flags=json.loads(text["flags_json"]),
        num_turns=int(cols["num_turns"][j]),
        num_tool_calls=int(cols["num_tool_calls"][j]),
        info=json.loads(text["info_json"]),
        routed_experts=_routing(tok["routed_experts"], cols, j),
        images=_images(tok["image_bytes"], tok["image_lengths"]),
    )
    trainer = tok["trainer_logprobs"].tolist() if cols["has_trainer_logprobs"][j] else None
    return RolloutRecord(int(cols["step"][j]), sample, trainer, str(path), i)
