"""What a generation engine adds for a vision-language policy (LLaVA): its image inputs, and quiet frozen-tower pushes.

The engine (:mod:`hetrl.rollout.engine`) owns the requests; this module answers three questions
about the model it serves: is it a vision-language checkpoint (:func:`reads_images`), how does it
take images (:func:`image_inputs_of`: the placeholder id, the positions an image fills, checked
against the context), and which of its tensors a push may leave out (:data:`VISION_TOWER_PREFIX`:
a frozen tower, ``model.vision.freeze``). :data:`FROZEN_TOWER_NOTICES` silences what vLLM says about
the tower a push left out, on purpose.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VISION_TOWER_PREFIX = "model.vision_tower."  # LLaVA's vision tower, as vLLM loads it (a frozen one is not pushed)
# The tower's final norm: LLaVA's features are a layer's patches, never the normed class token, so the
# trainer never changes it and pushes leave it out (hetrl.trainer.vision: a frozen parameter).
UNUSED_TOWER_PREFIX = VISION_TOWER_PREFIX + "vision_model.post_layernorm."


def reads_images(model_path: str | Path) -> bool:
    """Whether the checkpoint is a vision-language model (its config has a ``vision_config``)."""
    config_path = Path(model_path) / "config.json"
    return config_path.exists() and "vision_config" in json.loads(config_path.read_text())


@dataclass(frozen=True)
class ImageInputs:
    """How a vision-language engine takes images: one ``image_token_id`` per image in a token prompt,
    which vLLM expands to ``tokens_per_image`` positions of the context."""

    image_token_id: int
    image_token_text: str  # what vLLM's bad_words ban: it tokenizes to exactly [image_token_id]
    tokens_per_image: int


def image_inputs_of(llm_engine: Any, max_model_len: int) -> ImageInputs:
    """The image inputs of the multimodal model a vLLM ``LLMEngine`` serves, or raise naming what does not fit."""
    from vllm.multimodal import MULTIMODAL_REGISTRY

    model_config = llm_engine.model_config
    hf_config = model_config.hf_config
    if getattr(hf_config, "model_type", None) != "llava":  # LLaVA-NeXT, Qwen2-VL, ...: images of varying size
        raise RuntimeError(
            f"{model_config.model} ({model_config.architecture}): hetrl's engines serve LLaVA (model_type llava), "
            f"whose images each take a fixed number of positions; got model_type "
            f"{getattr(hf_config, 'model_type', None)!r}"
        )
    token_id = getattr(hf_config, "image_token_id", None)
    token_id = getattr(hf_config, "image_token_index", None) if token_id is None else token_id
    info = MULTIMODAL_REGISTRY.get_processing_info(model_config)
    if token_id is None or not hasattr(info, "get_max_image_tokens"):
        raise RuntimeError(
            f"{model_config.model} ({model_config.architecture}): hetrl's engines serve vision-language models "
            "whose config names the image token and whose images take a fixed number of positions (LLaVA)"
        )
    tokens_per_image = info.get_max_image_tokens()
    if tokens_per_image >= max_model_len:
        raise ValueError(
            f"the engine context ({max_model_len} tokens: rollout.max_model_len or model.max_position_embeddings) "
            f"cannot hold one image ({tokens_per_image} positions) and a response token"
        )
    tokenizer = llm_engine.get_tokenizer()
    text = tokenizer.convert_ids_to_tokens(token_id)
    if tokenizer.encode(text, add_special_tokens=False) != [token_id]:  # bad_words bans the text's tokens
        raise RuntimeError(
            f"the image token {token_id} ({text!r}) does not tokenize to itself, so it cannot be banned from sampling"
        )
    return ImageInputs(token_id, text, tokens_per_image)


class _FrozenTowerNotices(logging.Filter):
    """While a push without (part of) the vision tower is reloaded (``active``), drops vLLM's notices about its absence.

    vLLM lists the tower's parameters as "not loaded" and warns "<Layer>: Failed to load weights" for
    each of its layers, then keeps the weights they had -- the intended outcome, at every push. The
    engine checked the push complete but for the tower first, so no other layer can be missing; a
    "not loaded" list naming anything outside the tower still gets through. Only the in-process
    (TP=1) engine's records pass here: TP workers log in processes of their own.
    """

    LOGGERS = ("vllm.model_executor.model_loader.reload.layerwise", "vllm.model_executor.model_loader.reload.inplace")
    TOWER = "vision_tower."  # vLLM's own parameter names

    def __init__(self) -> None:
        super().__init__()
        self.active = False

    def attach(self) -> None:
        """Filter vLLM's reload loggers (once per process however often called: the same filter object)."""
        for name in self.LOGGERS:
            logging.getLogger(name).addFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.active:
            return True
        if record.msg == "%s: Failed to load weights":
            return False
        if str(record.msg).startswith("Following weights were not loaded") and record.args:
            return not all(str(name).startswith(self.TOWER) for name in record.args[0])
        return True


FROZEN_TOWER_NOTICES = _FrozenTowerNotices()
