"""Users' own tasks from a JSONL or Parquet file, with a report of every row that was skipped.

Accepted rows (one JSON object per line, or one Parquet row; extra columns go to ``metadata``):

* ``{"prompt": "...", "answer": ...}`` — a single user message and its reference answer;
* ``{"messages": [{"role", "content"}, ...], "answer": ...}`` — a prepared conversation;
* ``{"messages": [...], "tests": "<python asserts>" | [...], "entry_point": "f"}`` — a code task.

An optional ``"id"`` names the task. A bad row never stops the load: it is skipped, counted and
reported with its 1-based row number and the reason (a typo in one row of a million should not
kill a run, but it must be visible). A file without a single usable row is an error.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetrl.env.base import Task

log = logging.getLogger(__name__)

_ROLES = {"system", "user", "assistant", "tool"}
_KNOWN = {"id", "prompt", "messages", "answer", "tests", "entry_point"}
MAX_REPORTED = 20  # bad rows spelled out in the summary; all are kept in LoadReport.bad_rows


@dataclass
class BadRow:
    row: int  # 1-based line (JSONL) or row (Parquet) number
    reason: str


@dataclass
class LoadReport:
    path: str
    num_rows: int = 0
    num_loaded: int = 0
    bad_rows: list[BadRow] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"{self.path}: loaded {self.num_loaded} of {self.num_rows} rows, skipped {len(self.bad_rows)}"]
        lines += [f"  row {b.row}: {b.reason}" for b in self.bad_rows[:MAX_REPORTED]]
        if len(self.bad_rows) > MAX_REPORTED:
            lines.append(f"  ... and {len(self.bad_rows) - MAX_REPORTED} more")
        return "\n".join(lines)


def _check_messages(messages: Any) -> str | None:
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            return f"messages[{i}] needs a 'role' in {sorted(_ROLES)}"
        if not isinstance(m.get("content"), str):
            return f"messages[{i}] needs a string 'content'"
    if messages[-1]["role"] == "assistant":
        return "the last message is the assistant's: nothing left for the policy to answer"
    return None


def _check_tests(tests: Any) -> str | None:
    if isinstance(tests, str) and tests.strip():
        return None
    if isinstance(tests, list) and tests and all(isinstance(t, str) for t in tests):
        return None
    return "'tests' must be a non-empty string or a list of strings"


def row_to_task(row: Any, row_number: int, source: str) -> Task:
    """The Task of one row; ValueError with the reason when the row is unusable."""
    if not isinstance(row, dict):
        raise ValueError(f"a row must be an object, got {type(row).__name__}")
    row = {k: v for k, v in row.items() if v is not None}  # Parquet fills absent columns with nulls
    if ("prompt" in row) == ("messages" in row):
        raise ValueError("a row needs exactly one of 'prompt' or 'messages'")
    if "prompt" in row:
        if not isinstance(row["prompt"], str) or not row["prompt"].strip():
            raise ValueError("'prompt' must be a non-empty string")
        messages = [{"role": "user", "content": row["prompt"]}]
    else:
        problem = _check_messages(row["messages"])
        if problem:
            raise ValueError(problem)
        messages = [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
    if "tests" in row:
        problem = _check_tests(row["tests"])
        if problem:
            raise ValueError(problem)
        tests = row["tests"] if isinstance(row["tests"], str) else "\n".join(row["tests"])
        answer: Any = {"tests": tests, "entry_point": row.get("entry_point"), "prompt": ""}
    elif "answer" in row:
        answer = row["answer"]
    else:
        raise ValueError("a row needs an 'answer' (or 'tests' for code); without one it cannot be scored")
    task_id = str(row.get("id", f"{source}:{row_number}"))
    extra = {k: v for k, v in row.items() if k not in _KNOWN}
    return Task(task_id=task_id, source=source, messages=messages, answer=answer, metadata=extra)


def _rows(path: Path):
    """(row number, parsed row or the parse error) for each row of the file."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ValueError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from exc
        for i, row in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield i, row
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield i, json.loads(line)
            except json.JSONDecodeError as exc:
                yield i, ValueError(f"not valid JSON: {exc.msg} at column {exc.colno}")


class FileSource:
    """All usable rows of a ``.jsonl`` / ``.json`` (JSON lines) or ``.parquet`` file; see ``report``."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if path.suffix not in (".jsonl", ".json", ".parquet"):
            raise ValueError(f"{path}: task files must be .jsonl (JSON lines) or .parquet")
        if not path.is_file():
            raise ValueError(f"{path}: no such task file")
        self.name = path.stem
        self.report = LoadReport(path=str(path))
        self._tasks: list[Task] = []
        for number, row in _rows(path):
            self.report.num_rows += 1
            try:
                if isinstance(row, Exception):
                    raise row
                self._tasks.append(row_to_task(row, number, self.name))
            except ValueError as exc:
                self.report.bad_rows.append(BadRow(number, str(exc)))
        self.report.num_loaded = len(self._tasks)
        if not self._tasks:
            raise ValueError(f"no usable task in the file\n{self.report.summary()}")
        if self.report.bad_rows:
            log.warning("%s", self.report.summary())

    def __len__(self) -> int:
        return len(self._tasks)

    def __getitem__(self, index: int) -> Task:
        return self._tasks[index]
