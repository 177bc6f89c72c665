"""The frozen models a reward server holds: an LLM judge on vLLM and a sequence-classification reward model.

Both take a whole batch of requests at once -- the reward server hands them everything that
arrived since its last round -- and neither ever changes its weights. Requests carry text, not
token ids: a judge or a reward model has its own tokenizer and chat template, which need not be
the policy's.

* :class:`JudgeEngine` completes judge prompts. Each request names an assistant prefix, the number
  of tokens to write and how many next-token candidates to return, so one engine serves both
  ``reward.judge.scoring`` modes: ``verdict`` (write a reason and ``<score>N</score>``) and
  ``expected`` (the prompt ends in ``<score>``; the candidates' probabilities give the score).
* :class:`RewardModelScorer` scores conversations (text chat messages): each goes through the
  reward model's chat template, keeps its last ``max_length`` tokens (the response is what is
  judged) and logit 0 of the classification head is the reward.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetrl.config.reward import POLICY_MODEL, JudgeConfig, RewardModelConfig, RewardServerConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Completion:
    """A judge request: the user turn, the assistant's forced opening, and what to return."""

    prompt: str
    prefix: str = ""
    max_tokens: int = 1
    top_logprobs: int = 0


@dataclass
class CompletionResult:
    text: str
    top: dict[str, float] = field(default_factory=dict)  # first new token's candidates: decoded text -> probability


def resolve_model_path(path: str, policy_dir: Path) -> Path:
    """A served model's directory: ``policy`` names the run's initial policy checkpoint."""
    return Path(policy_dir) if path == POLICY_MODEL else Path(path)


def chat_text(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    """The conversation as the model was trained to read it (its chat template), or plain turns without one."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return "\n\n".join(m["content"] for m in messages) + ("\n\n" if add_generation_prompt else "")


class JudgeEngine:
    """A frozen judge model on an in-process vLLM engine (greedy: a verdict is reproducible)."""

    def __init__(self, model_dir: Path, judge: JudgeConfig, server: RewardServerConfig, seed: int) -> None:
        # lazy: torch and vLLM, only on a reward_server rank that serves a judge
        import torch

        from hetrl.rollout.engine import configure_vllm_environment, import_vllm

        on_gpu = torch.cuda.is_available()
        # On CPU the server shares the machine with the trainer and the engines: its threads keep to its own cores
        # (as many as the launcher gave the process: hetrl.launch.worker sets torch's thread count).
        threads = torch.get_num_threads()
        bind = None if on_gpu else ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[-threads:])
        configure_vllm_environment(bind, on_gpu, server.tensor_parallel)
        vllm = import_vllm()
        args: dict[str, Any] = dict(
            model=str(model_dir),
            tensor_parallel_size=server.tensor_parallel,
            max_model_len=judge.max_model_len,
            seed=seed,
            enforce_eager=not on_gpu,
            disable_log_stats=True,
            max_logprobs=max(judge.top_logprobs, 1),
        )
        if on_gpu:
            args.update(gpu_memory_utilization=server.gpu_memory_utilization)
        else:
            args.update(dtype="float32", kv_cache_memory_bytes=server.kv_cache_memory_mb << 20)
        self._vllm = vllm
        self.llm = vllm.LLM(**args)
        self.tokenizer = self.llm.get_tokenizer()
        self.max_model_len: int = self.llm.llm_engine.model_config.max_model_len

    def complete(self, requests: list[Completion]) -> list[CompletionResult | Exception]:
        """One batched greedy generate; a request that cannot fit the context comes back as its error."""
        results: list[CompletionResult | Exception] = [ValueError("unanswered")] * len(requests)
        prompts, params, index = [], [], []
        for i, request in enumerate(requests):
            try:
                text = chat_text(
                    self.tokenizer, [{"role": "user", "content": request.prompt}], add_generation_prompt=True
                )
                ids = self.tokenizer.encode(text + request.prefix, add_special_tokens=False)
            except Exception as error:  # noqa: BLE001 - this request's own fault (its template, its text): its answer
                results[i] = error
                continue
            if len(ids) + request.max_tokens > self.max_model_len:
                results[i] = ValueError(
                    f"judge prompt of {len(ids)} tokens + {request.max_tokens} to write exceeds the judge's context "
                    f"of {self.max_model_len} (reward.judge.max_response_chars, reward.judge.template)"
                )
                continue
            prompts.append(self._vllm.TokensPrompt(prompt_token_ids=ids))
            params.append(
                self._vllm.SamplingParams(
                    temperature=0.0, max_tokens=request.max_tokens, logprobs=request.top_logprobs or None
                )
            )
            index.append(i)
        if prompts:
            for i, output in zip(index, self.llm.generate(prompts, params, use_tqdm=False)):
                results[i] = self._result(output.outputs[0])
        return results

    def _result(self, completion: Any) -> CompletionResult:
        import math

        top: dict[str, float] = {}
        if completion.logprobs:
            for token_id, logprob in completion.logprobs[0].items():
                text = logprob.decoded_token if logprob.decoded_token is not None else self.tokenizer.decode([token_id])
                top[text] = top.get(text, 0.0) + math.exp(logprob.logprob)
        return CompletionResult(completion.text, top)


class RewardModelScorer:
    """A frozen sequence-classification reward model; ``policy`` puts a fresh seeded scalar head on the initial
    policy."""

    def __init__(self, model_dir: Path, config: RewardModelConfig, seed: int, fresh_head: bool) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self._torch = torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
        torch.manual_seed(seed)  # the fresh head's initial values
        kwargs = {"num_labels": 1} if fresh_head else {}
        dtype = (
            "auto" if device == "cuda" else torch.float32
        )  # the checkpoint's dtype on a GPU; bf16 is slow on most CPUs
        self.model = (
            AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=dtype, **kwargs).to(device).eval()
        )
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        pad = self.model.config.pad_token_id
        self.pad_id = int(pad if pad is not None else (self.tokenizer.pad_token_id or 0))
        self.model.config.pad_token_id = self.pad_id  # HF's classifier pools at the last non-pad token
        self.device, self.config = device, config

    def score(self, conversations: list[list[dict[str, str]]]) -> list[float | Exception]:
        """Logit 0 per conversation, in batches of ``reward.reward_model.batch_size``; a conversation the
        model's chat template refuses (a role it does not know) comes back as its error."""
        results: list[float | Exception] = []
        sequences, index = [], []
        for i, messages in enumerate(conversations):
            try:
                text = chat_text(self.tokenizer, messages, add_generation_prompt=False)
                ids = self.tokenizer.encode(text, add_special_tokens=False)[-self.config.max_length :]
            except Exception as error:  # noqa: BLE001 - this conversation's own fault: its answer
                results.append(error)
                continue
            results.append(0.0)
            sequences.append(ids or [self.pad_id])
            index.append(i)
        for start in range(0, len(sequences), self.config.batch_size):
            scores = self._forward(sequences[start : start + self.config.batch_size])
            for i, score in zip(index[start : start + self.config.batch_size], scores):
                results[i] = score
        return results

    def _forward(self, sequences: list[list[int]]) -> list[float]:
        """One right-padded forward pass with an attention mask."""
        torch = self._torch
        width = max(len(s) for s in sequences)
        ids = torch.full((len(sequences), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, seq in enumerate(sequences):
            ids[row, : len(seq)] = torch.tensor(seq)
            mask[row, : len(seq)] = 1
        with torch.no_grad():
            logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
        return logits[:, 0].float().cpu().tolist()
