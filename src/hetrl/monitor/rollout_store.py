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


class _OpenFile:
    """One file opened for SWMR reading with its commit count fixed at open time."""

    def __init__(self, path: Path):
        self.path = path
        self.f = h5py.File(path, "r", libver="latest", swmr=True)
        step = self.f["samples/step"]
        step.refresh()
        self.num = int(step.shape[0])
        for ds in self._all_datasets():
            ds.refresh()

    def _all_datasets(self):
        for group in ("samples", "ragged"):
            for obj in self.f[group].values():
                if isinstance(obj, h5py.Dataset):
                    yield obj
                else:
                    yield from obj.values()

    # A file written before a field existed (v1 had no routing) reads as if every row left it empty.
    # Every read takes a window of rows [lo, hi): a viewer of a run with a million samples reads
    # only the rows it shows.

    def column(self, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        hi = self.num if hi is None else hi
        if f"samples/{name}" not in self.f:
            return np.zeros(hi - lo, dtype=_COLUMNS[name])
        return self.f[f"samples/{name}"][lo:hi]

    def bounds(self, field_name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Where rows lo..hi-1 of a ragged field start, and where the last one ends (hi - lo + 1 offsets)."""
        hi = self.num if hi is None else hi
        if f"ragged/{field_name}" not in self.f:
            return np.zeros(hi - lo + 1, dtype=np.int64)
        end = self.f[f"ragged/{field_name}/end"][max(lo - 1, 0) : hi]
        return end if lo else np.concatenate([np.zeros(1, np.int64), end])

    def ragged(self, field_name: str, index: int, lo: int, bounds: dict[str, np.ndarray]) -> np.ndarray:
        """Row ``index``'s values of a ragged field; ``bounds`` from :meth:`bounds` over a window starting at ``lo``."""
        owner = _TOKEN_FIELDS[field_name][1] if field_name in _TOKEN_FIELDS else field_name
        if f"ragged/{field_name}" not in self.f:
            return np.zeros(0, dtype=_TOKEN_FIELDS[field_name][0] if field_name in _TOKEN_FIELDS else np.uint8)
        b = bounds[owner]
        return self.f[f"ragged/{field_name}/values"][int(b[index - lo]) : int(b[index - lo + 1])]

    def strings(self, field_name: str, lo: int = 0, hi: int | None = None) -> list[str]:
        b = self.bounds(field_name, lo, hi)
        blob = self.f[f"ragged/{field_name}/values"][int(b[0]) : int(b[-1])].tobytes()
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
                ids, tasks, flags, finish = (
                    of.strings(k, lo, hi) for k in ("sample_id", "task_name", "flags_json", "finish_reason")
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
                        )
                    )
            finally:
                of.close()
        return out

    def load(self, rows: list[RolloutRow]) -> list[RolloutRecord]:
        """Full records for the given rows (in the same order); reads each file's window of the rows asked for."""
        by_file: dict[str, list[int]] = {}
        for pos, row in enumerate(rows):
            by_file.setdefault(row.file, []).append(pos)
        out: list[RolloutRecord | None] = [None] * len(rows)
        for file, positions in by_file.items():
            of = _OpenFile(Path(file))
            try:
                indices = [rows[pos].index for pos in positions]
                lo, hi = min(indices), max(indices) + 1
                bounds = {k: of.bounds(k, lo, hi) for k in _OFFSET_FIELDS}
                cols = {k: of.column(k, lo, hi) for k in _COLUMNS}
                for pos, index in zip(positions, indices):
                    out[pos] = _read_record(of, index, lo, bounds, cols)
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


def _read_record(
    of: _OpenFile, i: int, lo: int, bounds: dict[str, np.ndarray], cols: dict[str, np.ndarray]
) -> RolloutRecord:
    """Row ``i`` of a file whose window of rows starting at ``lo`` was read into ``bounds`` and ``cols``."""
    text = {k: of.ragged(k, i, lo, bounds).tobytes().decode("utf-8") for k in _STRING_FIELDS}
    tok = {k: of.ragged(k, i, lo, bounds) for k in _TOKEN_FIELDS}
    j = i - lo
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
    return RolloutRecord(int(cols["step"][j]), sample, trainer, str(of.path), i)
