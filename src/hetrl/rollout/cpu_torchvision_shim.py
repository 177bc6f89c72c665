"""The one CPU-only shim of hetrl's engines: vLLM's vision-language models without torchvision.

Why: PyPI's torchvision is a CUDA build that breaks beside the CPU torch (``operator
torchvision::nms does not exist``, after which transformers cannot even import Llama), so
``install.sh`` removes it on CPU machines. transformers then processes images with its PIL
backends (``CLIPImageProcessor`` falls back to ``CLIPImageProcessorPil``), the same in the
engine and in the trainer. But vLLM's LLaVA module imports its Pixtral module, which imports
``transformers.models.pixtral.image_processing_pixtral``, which imports torchvision at its top
line, for one helper (``_num_image_tokens``) that only Pixtral vision towers ever call.

What: when torchvision is *absent*, :func:`apply` puts a stand-in for that one transformers
module in ``sys.modules`` (its helper raises: Pixtral towers need a real torchvision), then
registers the vLLM model class of the architecture being served with the class itself. The
second step matters as much as the first: vLLM inspects a lazily registered model class in a
fresh ``python -m vllm.model_executor.models.registry`` subprocess, which would not have the
stand-in; a class registered as an object is inspected here. Where torchvision imports (GPU
images), nothing is touched; where it is installed but broken, :func:`apply` says how to fix it.

Who calls it: the engine, before it starts a vision-language model; the vLLM workers of a TP
engine through :mod:`hetrl.rollout.worker_extension` (spawned processes import it before they
load the model).
"""

from __future__ import annotations

import importlib.util
import sys
import types

PIXTRAL_IMAGE_PROCESSING = "transformers.models.pixtral.image_processing_pixtral"


def torchvision_state() -> str:
    """``"absent"``, ``"working"``, or the error a present torchvision raises on import."""
    if importlib.util.find_spec("torchvision") is None:
        return "absent"
    try:
        import torchvision  # noqa: F401
    except Exception as error:  # noqa: BLE001 - any failure to import it is reported
        return f"{type(error).__name__}: {error}"
    return "working"


def _pixtral_num_image_tokens(*args: object, **kwargs: object) -> tuple[int, int]:
    raise RuntimeError(
        "Pixtral vision towers need torchvision, which this CPU install leaves out "
        "(hetrl.rollout.cpu_torchvision_shim); serve them where a working torchvision is installed"
    )


def install_pixtral_stand_in() -> bool:
    """Put the stand-in module in place if torchvision is absent; return whether it is in place."""
    if isinstance(sys.modules.get(PIXTRAL_IMAGE_PROCESSING), _StandIn):
        return True
    if importlib.util.find_spec("torchvision") is not None:
        return False
    stand_in = _StandIn(
        PIXTRAL_IMAGE_PROCESSING, "hetrl's stand-in: transformers' Pixtral image processor without torchvision"
    )
    stand_in._num_image_tokens = _pixtral_num_image_tokens
    sys.modules[PIXTRAL_IMAGE_PROCESSING] = stand_in
    return True


class _StandIn(types.ModuleType):
    """A module whose every other attribute names why it is missing."""

    def __getattr__(self, name: str) -> object:
        raise AttributeError(
            f"{self.__name__}.{name}: transformers' Pixtral image processor needs torchvision, "
            "which this CPU install leaves out (hetrl.rollout.cpu_torchvision_shim)"
        )


def apply(architecture: str) -> bool:
    """Make vLLM's class for ``architecture`` importable without torchvision; return whether the shim was needed.

    Raises when torchvision is installed but does not import: then transformers itself breaks.
    """
    state = torchvision_state()
    if state == "working":
        return False
    if state != "absent":
        raise RuntimeError(
            f"torchvision is installed but does not import beside this torch ({state}); on CPU machines "
            "uninstall it (pip uninstall torchvision; install.sh does): hetrl runs without it there"
        )
    install_pixtral_stand_in()
    from vllm.model_executor.models import ModelRegistry

    registered = ModelRegistry.models.get(architecture)
    if registered is None:
        raise RuntimeError(f"vLLM has no model class for {architecture}")
    ModelRegistry.register_model(architecture, registered.load_model_cls())  # inspected here, not in a subprocess
    return True
