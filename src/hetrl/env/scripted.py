"""A scripted (non-model) policy: replies chosen by a function of the conversation so far.

It stands in for an engine wherever the environment machinery itself is under test or measured
(tests, ``bench/env_throughput.py``): same ``generate`` signature as an engine client, sampled ids
are the reply's tokens plus end-of-turn, with made-up but deterministic log-probs. Being a pure
function of the prompt, one instance serves any number of concurrent episodes.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

from hetrl.env.chat import ChatCodec
from hetrl.types import GenerationResult, SamplingParams


class ScriptedPolicy:
    """``script(conversation_text) -> reply text``; every call is kept in ``calls`` for inspection."""

    def __init__(self, codec: ChatCodec, script: Callable[[str], str], version: int = 0, record: bool = True) -> None:
        self.codec = codec
        self.script = script
        self.version = version
        self.record = record
        self.calls: list[tuple[list[int], GenerationResult]] = []
        self._ids = itertools.count()
        self._eos = codec.tokenizer.eos_token_id

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, images: list[Any] | None = None) -> GenerationResult:
        reply_ids = self.codec.encode(self.script(self.codec.decode(prompt_ids))) + [self._eos]
        finish = "stop"
        if len(reply_ids) > sampling.max_tokens:
            reply_ids, finish = reply_ids[: sampling.max_tokens], "length"
        result = GenerationResult(
            request_id=f"scripted-{next(self._ids)}", sample_index=0, prompt_ids=list(prompt_ids),
            response_ids=reply_ids, logprobs=[-0.01 * (1 + t % 7) for t in reply_ids],
            versions=[self.version] * len(reply_ids), finish_reason=finish,
        )
        if self.record:
            self.calls.append((list(prompt_ids), result))
        return result
