"""Concurrent scoring for the reward role: samples in, verdicts out as each one finishes.

Why threads: a rubric's sources spend their time waiting -- on sandboxed test programs (each a
subprocess), on the served judge or reward model (a request over the control plane), on
math-verify's deadline workers. Scoring one sample at a time would hold a step up behind its
slowest program; ``concurrency`` samples at once keep the sandbox pool and the served models busy
while the caller (the reward role's MPI loop, which owns every MPI call) keeps polling.

Contract: :meth:`ConcurrentScorer.submit` never blocks; :meth:`ConcurrentScorer.finished` returns
what completed since the last call, the verdicts (``ScoredSample``) and ``(sample_id, error)`` of samples
whose scoring failed (the rubric never raises, not for a hostile sample nor for a served model that did
not answer: a failure means the rubric broke, and the orchestrator has those samples scored again).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from hetrl.control.protocol import ScoredSample
from hetrl.reward.base import Scorable
from hetrl.reward.rubric import Rubric


class ConcurrentScorer:
    """Scores up to ``concurrency`` samples at once on threads; results stream out in finishing order."""

    def __init__(self, rubric: Rubric, concurrency: int, wake: threading.Event | None = None) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.rubric = rubric
        self._executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="score")
        self._lock = threading.Lock()
        self._done: list[ScoredSample] = []
        self._failed: list[tuple[str, BaseException]] = []
        self._in_flight = 0
        self.wake = wake or threading.Event()  # set whenever a sample finishes: the caller may sleep on it

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def submit(self, sample: Scorable) -> None:
        with self._lock:
            self._in_flight += 1
        self._executor.submit(self._score, sample).add_done_callback(self._collect_crash(sample))

    def _score(self, sample: Scorable) -> None:
        scored = self.rubric.score(sample).verdict(sample.sample_id)
        with self._lock:
            self._done.append(scored)
            self._in_flight -= 1
        self.wake.set()

    def _collect_crash(self, sample: Scorable) -> Callable[[Future], None]:
        def check(future: Future) -> None:
            if future.cancelled():  # never started: close() cancelled it
                with self._lock:
                    self._in_flight -= 1
                return
            error = future.exception()
            if error is None:
                return
            with self._lock:
                self._failed.append((sample.sample_id, error))
                self._in_flight -= 1
            self.wake.set()

        return check

    def finished(self) -> tuple[list[ScoredSample], list[tuple[str, BaseException]]]:
        """Verdicts and ``(sample_id, error)`` of failed samples since the last call; never blocks."""
        with self._lock:
            done, failed = self._done, self._failed
            self._done, self._failed = [], []
            self.wake.clear()  # a sample finishing after this sets it again
            return done, failed

    def close(self) -> None:
        """Drop the samples not started, wait for those being scored, then release the rubric (its sandbox pool)."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.rubric.close()
