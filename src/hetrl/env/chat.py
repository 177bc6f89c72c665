"""Chat messages -> token ids without ever re-tokenising what the policy sampled.

Re-rendering and re-tokenising a whole conversation each turn silently changes earlier tokens (BPE
merges across the turn boundary, templates that rewrite old assistant turns), so the trainer would
score tokens the engine never sampled. Instead the prompt is tokenised once, the policy's ids are
kept verbatim, and each observation is appended as the *template delta*: the conversation is
rendered with and without the new messages and only the text suffix is tokenised.

Two details make the delta exact:

* The assistant turn's closing text (``<|im_end|>\\n`` in ChatML) is partly generated (the engine
  stops on the end-of-turn token) and partly not (the newline). ``ChatCodec`` learns the closer
  from the template once and appends only the part the policy did not emit.
* Some templates rewrite earlier turns when a new one follows (Qwen3 drops old reasoning), so the
  rendering with the new messages does not extend the one without. The delta is then taken
  against a fixed stand-in conversation, which gives the same suffix for per-message templates.
"""

from __future__ import annotations

from typing import Any

from hetrl.env.base import Message

_SENTINEL = "\x00HETRL_SENTINEL\x00"
# Stand-in conversations for templates whose rendering of the real history changes when more
# follows: one ending in an assistant turn, and one ending in a user turn (for templates that also
# rewrite the last assistant turn once it is no longer last).
_STAND_INS: tuple[list[Message], ...] = (
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
    [{"role": "user", "content": "x"}],
)


class ChatCodec:
    """Renders and tokenises chat messages through a HF tokenizer's chat template.

    ``image_placeholder``: templates that only take string content (like the character tokenizer's)
    get list-of-parts messages flattened to text, each image becoming this placeholder. Set it to
    ``None`` for a multimodal template (processor-style) that renders parts itself.
    """

    def __init__(self, tokenizer: Any, image_placeholder: str | None = "<image>") -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat_template; environments render turns through it")
        self.tokenizer = tokenizer
        self.image_placeholder = image_placeholder
        self.stop_ids = {tokenizer.eos_token_id} - {None}
        # A fast tokenizer's Rust backend does the same encode/decode without transformers' per-call
        # Python overhead (which dominated episode time in bench/env_throughput.py). HF's decode may
        # also clean up spaces, which must not happen to text the policy sees.
        self._backend = tokenizer.backend_tokenizer if getattr(tokenizer, "is_fast", False) else None
        # Where the placeholder is one token (a vision-language tokenizer), the same text inside a message
        # (a task, a tool's output, text the policy typed) would read as an image with none sent: it is
        # rendered with a space after its "<" instead.
        self._escaped = None
        if image_placeholder is not None and len(self.encode(image_placeholder)) == 1:
            self._escaped = image_placeholder[:1] + " " + image_placeholder[1:]
        self._closer = self._learn_turn_closer()

    # --- rendering -----------------------------------------------------------------------------
    def _text(self, text: str) -> str:
        """A message's own text, with the image placeholder escaped where it is a token (see ``__init__``)."""
        return text.replace(self.image_placeholder, self._escaped) if self._escaped else text

    def _normalise(self, messages: list[Message]) -> list[Message]:
        if self.image_placeholder is None:
            return messages
        out = []
        for m in messages:
            content = m.get("content")
            if isinstance(content, list):
                text = "".join(
                    self.image_placeholder if p.get("type") == "image" else self._text(p.get("text", ""))
                    for p in content
                )
                m = {**m, "content": text}
            elif content is None:
                m = {**m, "content": ""}
            elif isinstance(content, str) and self._escaped:
                m = {**m, "content": self._text(content)}
            out.append(m)
        return out

    def render(self, messages: list[Message], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            self._normalise(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=False)
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _learn_turn_closer(self) -> str:
        """The text the template puts after an assistant message's content (``<|im_end|>\\n``)."""
        user = [{"role": "user", "content": "x"}]
        opened = self.render(user, add_generation_prompt=True)
        closed = self.render(user + [{"role": "assistant", "content": _SENTINEL}], add_generation_prompt=False)
        if not closed.startswith(opened) or _SENTINEL not in closed:
            raise ValueError(
                "the chat template does not render an assistant turn after its generation prompt; "
                "token-in-token-out needs a template whose generation prompt opens the assistant turn"
            )
        return closed[closed.index(_SENTINEL) + len(_SENTINEL) :]

    # --- the three conversions the runner needs ------------------------------------------------
    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """Token ids of the first observation, ending with the assistant generation prompt."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def action_text(self, response_ids: list[int]) -> str:
        """The assistant message content for sampled ids (a trailing end-of-turn token dropped)."""
        if response_ids and response_ids[-1] in self.stop_ids:
            response_ids = response_ids[:-1]
        return self.decode(response_ids)

    def observation_ids(
        self, history: list[Message], observations: list[Message], response_ids: list[int]
    ) -> list[int]:
        """Ids to append after the policy's ``response_ids`` so the sequence continues as the template would.

        ``history`` ends with the assistant message just generated; the result closes that turn
        (the part of the closer the policy did not emit), then renders ``observations`` and opens
        the next assistant turn.
        """
        closer = self._closer
        if response_ids and response_ids[-1] in self.stop_ids:
            emitted = self.decode(response_ids[-1:])
            if closer.startswith(emitted):
                closer = closer[len(emitted) :]
        return self.encode(closer + self._delta(history, observations))

    def _delta(self, history: list[Message], observations: list[Message]) -> str:
        """Rendered text of ``observations`` plus the next generation prompt, after a closed assistant turn."""
        for base in (history, *_STAND_INS):
            before = self.render(base, add_generation_prompt=False)
            after = self.render(base + observations, add_generation_prompt=True)
            if after.startswith(before):
                return after[len(before) :]
        raise ValueError(
            "the chat template renders observations differently depending on the conversation; "
            "cannot append them as a token delta"
        )
