"""The reward worker role: finished Samples in, ``(sample_id, RewardOutcome)`` out.

In-process API: ``RewardWorker.score_batch(samples)`` scores concurrently (sandbox runs and
reward-model requests overlap) and returns results in input order. The MPI wiring lives in the
loop; what it needs for exactly-once accounting is ``ResultTable``: the loop assigns each sample
id to a worker, records results idempotently (a late duplicate from a worker presumed dead is
ignored and counted), and when a worker crashes takes back its unfinished ids to send elsewhere.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from hetrl.reward.base import RewardOutcome
from hetrl.reward.rubric import Rubric
from hetrl.types import Sample


class RewardWorker:
    def __init__(self, rubric: Rubric, concurrency: int = 4) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.rubric = rubric
        self._executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="reward")

    def score(self, sample: Sample) -> tuple[str, RewardOutcome]:
        return sample.sample_id, self.rubric.score(sample)

    def score_batch(self, samples: list[Sample]) -> list[tuple[str, RewardOutcome]]:
        return list(self._executor.map(self.score, samples))

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.rubric.close()


class ResultTable:
    """Exactly-once bookkeeping of reward results keyed by sample id (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: dict[str, str] = {}  # pending sample id -> worker it was sent to
        self._results: dict[str, RewardOutcome] = {}
        self.duplicates = 0

    def assign(self, sample_id: str, worker: str) -> None:
        with self._lock:
            if sample_id in self._results:
                raise ValueError(f"sample {sample_id} already has a reward; assigning it again would double-count")
            self._owner[sample_id] = worker

    def record(self, sample_id: str, outcome: RewardOutcome) -> bool:
        """Keep the first result for an id; return False (and count it) for any later one."""
        with self._lock:
            if sample_id in self._results:
                self.duplicates += 1
                return False
            self._results[sample_id] = outcome
            self._owner.pop(sample_id, None)
            return True

    def worker_failed(self, worker: str) -> list[str]:
        """Ids the failed worker still owed, now unassigned: send them to another worker."""
        with self._lock:
            lost = sorted(sid for sid, w in self._owner.items() if w == worker)
            for sid in lost:
                del self._owner[sid]
            return lost

    def pending(self) -> dict[str, str]:
        with self._lock:
            return dict(self._owner)

    def result(self, sample_id: str) -> RewardOutcome | None:
        with self._lock:
            return self._results.get(sample_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._results)
