"""A character-level tokenizer with a ChatML template, for random-init models that have no tokenizer.

Tiny test and embedded-default models cannot download a real tokenizer (no hub access), yet vLLM,
the environments and the trainer all need a real ``PreTrainedTokenizerFast`` with a chat template.
One token per printable ASCII character keeps arithmetic answers short and learnable.
"""

from __future__ import annotations

import string
from pathlib import Path

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
UNK_TOKEN = "<|unk|>"
IMAGE_TOKEN = "<image>"  # a vision-language model's image placeholder: one token, where the image's embeddings go
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END, UNK_TOKEN]
CHARACTERS = [c for c in string.printable if c not in "\r\x0b\x0c"]  # 97: letters, digits, punctuation, space, \t, \n

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + len(CHARACTERS)


def build_char_tokenizer(vocab_size: int = 128, image_token: bool = False):
    """Return a ``PreTrainedTokenizerFast``: special tokens first (pad/eos = id 0), then characters.

    The vocabulary is padded with reserved tokens up to ``vocab_size`` so that it matches the
    model's embedding table exactly. ``image_token`` (vision-language models) makes the first
    reserved slot :data:`IMAGE_TOKEN`, a special token, so ``"<image>"`` in a prompt is one id.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"the character tokenizer needs vocab_size >= {MIN_VOCAB_SIZE}, got {vocab_size}")
    if image_token and vocab_size <= MIN_VOCAB_SIZE:
        raise ValueError(
            f"the character tokenizer with an image token needs vocab_size > {MIN_VOCAB_SIZE}, got {vocab_size}"
        )
    special = SPECIAL_TOKENS + ([IMAGE_TOKEN] if image_token else [])
    tokens = SPECIAL_TOKENS + CHARACTERS + ([IMAGE_TOKEN] if image_token else [])
    tokens += [f"<|reserved_{i}|>" for i in range(vocab_size - len(tokens))]
    backend = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(tokens)}, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(special)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=1 << 20,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_char_tokenizer(directory: Path, vocab_size: int = 128, image_token: bool = False) -> Path:
    directory = Path(directory)
    build_char_tokenizer(vocab_size, image_token).save_pretrained(directory)
    return directory
