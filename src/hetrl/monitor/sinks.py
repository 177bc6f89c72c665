"""Where a step's metrics go: JSONL and TensorBoard always, Weights & Biases when asked for.

Each sink takes ``write(step, metrics)`` with one flat ``{name: float}`` dict per call and must
make it durable before returning (flushes every write): a crashed or pre-empted run keeps every
step it finished. The JSONL file is the source of truth the plot tool reads.
"""

from __future__ import annotations

import importlib
import json
import math
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from hetrl.config.monitor import WandbConfig

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


class Sink(Protocol):
    def write(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """One JSON object per line: ``{"step": s, "time": unix_s, "<name>": value, ...}``.

    Non-finite values are written as strings ("nan", "inf", "-inf"): strict JSON has no NaN, and a
    NaN loss is exactly what one needs to see afterwards.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        row: dict[str, Any] = {"step": int(step), "time": time.time()}
        for name, value in metrics.items():
            value = float(value)
            row[name] = value if math.isfinite(value) else str(value)
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def read_jsonl(path: str | Path) -> dict[int, dict[str, float]]:
    """Metrics per step from a JSONL sink file; several lines of one step are merged (last wins)."""
    steps: dict[int, dict[str, float]] = {}
    with Path(path).open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            row = json.loads(line)
            step = int(row.pop("step"))
            row.pop("time", None)
            steps.setdefault(step, {}).update({k: float(v) for k, v in row.items()})
    return dict(sorted(steps.items()))


class TensorBoardSink:
    """Scalars as TensorBoard event files, with tensorboard's own writer.

    Not torch's SummaryWriter: it wraps this same writer but costs a ~3 s torch import, and the
    process holding the monitor (or a login-node tool) need not have torch at all.
    """

    def __init__(self, logdir: str | Path):
        Path(logdir).mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(logdir))

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        values = [Summary.Value(tag=name, simple_value=float(value)) for name, value in metrics.items()]
        self._writer.add_event(Event(wall_time=time.time(), step=int(step), summary=Summary(value=values)))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """Logs to a W&B run; built only through :func:`build_wandb_sink`, which handles a missing package."""

    def __init__(self, wandb_module: Any, cfg: WandbConfig, run_dir: Path, run_config: Mapping[str, Any] | None):
        self._wandb = wandb_module
        self._run = wandb_module.init(
            project=cfg.project,
            entity=cfg.entity,
            name=cfg.name or run_dir.name,
            dir=str(run_dir),
            mode=cfg.mode,
            config=dict(run_config or {}),
            resume="allow",
        )

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log(dict(metrics), step=int(step))

    def close(self) -> None:
        self._run.finish()


def build_wandb_sink(cfg: WandbConfig, run_dir: Path, run_config: Mapping[str, Any] | None = None) -> WandbSink | None:
    """The W&B sink when enabled and importable; warns (never fails the run) when the package is absent."""
    if not cfg.enabled:
        return None
    try:
        wandb = importlib.import_module("wandb")
    except ImportError:
        warnings.warn(
            "monitor.wandb.enabled is true but the `wandb` package is not installed: W&B logging is off", stacklevel=2
        )
        return None
    return WandbSink(wandb, cfg, run_dir, run_config)
