"""A sequence-classification reward model (HF checkpoint) served with batching, usable as a reward function.

``RewardModelServer.score(prompt_ids, completion_ids)`` may be called from many threads (the
reward worker scores samples concurrently): requests queue up and a single serving thread runs
them through the model in batches of up to ``batch_size``, waiting at most ``max_wait_s`` to fill
a batch. The model scores token ids, so it must share the policy's tokenizer; sequences longer
than ``max_length`` keep their END (the response is what is judged). Logit 0 of the
classification head is the reward.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any

from hetrl.reward.base import RewardValue
from hetrl.types import Sample


class RewardModelServer:
    def __init__(self, path: str, batch_size: int = 8, max_length: int = 2048, max_wait_s: float = 0.01, num_threads: int = 1) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification

        torch.set_num_threads(num_threads)
        self._torch = torch
        self.model = AutoModelForSequenceClassification.from_pretrained(path, torch_dtype=torch.float32).eval()
        pad = self.model.config.pad_token_id
        self.pad_id = 0 if pad is None else int(pad)
        self.model.config.pad_token_id = self.pad_id  # HF's classifier pools at the last non-pad token
        self.batch_size, self.max_length, self.max_wait_s = batch_size, max_length, max_wait_s
        self._queue: queue.Queue[tuple[list[int], Future] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="reward-model", daemon=True)
        self._thread.start()
        self.batches_run = 0

    def score(self, prompt_ids: list[int], completion_ids: list[int]) -> float:
        return self.submit(prompt_ids, completion_ids).result()

    def submit(self, prompt_ids: list[int], completion_ids: list[int]) -> Future:
        fut: Future = Future()
        ids = (list(prompt_ids) + list(completion_ids))[-self.max_length :]
        if not ids:
            fut.set_exception(ValueError("reward model got an empty sequence"))
        else:
            self._queue.put((ids, fut))
        return fut

    def score_batch(self, pairs: list[tuple[list[int], list[int]]]) -> list[float]:
        return [f.result() for f in [self.submit(p, c) for p, c in pairs]]

    def forward(self, sequences: list[list[int]]) -> list[float]:
        """One padded forward pass (right padding + attention mask); logit 0 per sequence."""
        torch = self._torch
        width = max(len(s) for s in sequences)
        ids = torch.full((len(sequences), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, seq in enumerate(sequences):
            ids[row, : len(seq)] = torch.tensor(seq)
            mask[row, : len(seq)] = 1
        with torch.no_grad():
            logits = self.model(input_ids=ids, attention_mask=mask).logits
        return logits[:, 0].float().tolist()

    def _serve(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self.batch_size:
                try:
                    item = self._queue.get(timeout=self.max_wait_s)
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)
                    break
                batch.append(item)
            try:
                scores = self.forward([ids for ids, _ in batch])
                for (_, fut), s in zip(batch, scores):
                    fut.set_result(s)
            except Exception as exc:  # fail these requests, keep serving
                for _, fut in batch:
                    fut.set_exception(exc)
            self.batches_run += 1

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


class RewardModelReward:
    """Reward function: the reward model's score of prompt+completion tokens, times ``scale``."""

    def __init__(self, reward_model: RewardModelServer | None = None, path: str | None = None, scale: float = 1.0, **server: Any) -> None:
        if reward_model is None and path is None:
            raise ValueError("reward_model reward needs a served model (resource 'reward_model') or kwargs.path to an HF checkpoint")
        self.server = reward_model or RewardModelServer(path, **server)
        self._owned = reward_model is None
        self.scale = scale

    def __call__(self, sample: Sample) -> RewardValue:
        return RewardValue(self.scale * self.server.score(sample.prompt_ids, sample.completion_ids))

    def close(self) -> None:
        if self._owned:
            self.server.close()
