"""Run megatron-core on a machine without a GPU (gloo, fp32 or bf16): the ONE place that knows how.

megatron-core (0.16) assumes CUDA throughout: ``torch.cuda.current_device()`` as a device,
``device="cuda"`` literals (optimizer, grad clipping, pipeline schedules, the default causal
mask), ``.cuda()`` calls, CUDA streams and events in the MoE all-to-all dispatcher, a CUDA RNG
state in the tensor-parallel RNG tracker, and ``param.type() == 'torch.cuda.FloatTensor'``
(or ``BFloat16Tensor``: the mixed-precision optimizer) checks. None of that is wrong on a GPU
cluster, so nothing is changed there: :func:`ensure_applied` does nothing when
``torch.cuda.is_available()``.

Without a GPU it makes the CPU pose as "the CUDA device", in three parts:

* a process-wide :class:`torch.overrides.TorchFunctionMode` that rewrites every CUDA device
  argument (``"cuda"``, ``torch.device("cuda", i)``, a bare index) to ``cpu``, turns
  ``Tensor.cuda()`` / ``Tensor.record_stream()`` into no-ops, reports float32 (bf16, fp16) CPU
  tensors as ``torch.cuda.FloatTensor`` (``BFloat16Tensor``, ``HalfTensor``) to ``Tensor.type()``
  (the dtype checks above), and drops
  ``pin_memory`` requests (page-locked memory needs an accelerator; it only speeds copies to one).
  Autograd runs backward functions outside any function mode, so what backward passes need is
  patched at the source instead: ``current_device()`` is the CPU device, and the MoE dispatcher's
  split sizes become host arrays (it converts only CUDA tensors);
* ``torch.cuda`` functions that would raise "Torch not compiled with CUDA enabled" become CPU
  stand-ins: ``current_device() -> torch.device("cpu")``, stream/event objects whose
  waits are no-ops (CPU work is synchronous), ``synchronize``/``empty_cache`` no-ops;
* the tensor-parallel RNG tracker keeps CPU generator states instead of CUDA ones, so
  ``model_parallel_cuda_manual_seed`` and ``get_cuda_rng_tracker().fork()`` work.

One fix is not about CUDA and is applied on GPUs too: megatron's MoE router reads a name that is
bound only when transformer-engine imports.

Only the main thread (and processes forked from it) sees the mode: torch keeps the mode stack per
thread, and megatron's CPU training path runs on the thread that calls ``backward``. Trainer
modules call :func:`ensure_applied` before touching megatron; nothing else needs to know.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_APPLIED = False
_LOCK = threading.Lock()
_CPU = torch.device("cpu")
# What megatron's optimizer compares ``param.type()`` against, by dtype.
_CUDA_TYPE_NAMES = {
    torch.float32: "torch.cuda.FloatTensor",
    torch.bfloat16: "torch.cuda.BFloat16Tensor",
    torch.float16: "torch.cuda.HalfTensor",
}


def _to_cpu_device(device: Any) -> Any:
    """The CPU stand-in for a CUDA device spec; anything else unchanged."""
    if isinstance(device, bool):
        return device
    if isinstance(device, int):  # a bare index means a CUDA device in torch's factory functions
        return _CPU
    if isinstance(device, str) and device.split(":")[0] == "cuda":
        return _CPU
    if isinstance(device, torch.device) and device.type == "cuda":
        return _CPU
    return device


class _CpuAsCudaMode(TorchFunctionMode):
    """Redirects CUDA device arguments of every torch call to the CPU (see the module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch protocol
        kwargs = kwargs or {}
        if func in (torch.Tensor.cuda, torch.Tensor.pin_memory):
            return args[0]
        if func is torch.Tensor.record_stream:
            return None
        if func is torch.Tensor.type and len(args) == 1 and not kwargs and args[0].dtype in _CUDA_TYPE_NAMES:
            return _CUDA_TYPE_NAMES[args[0].dtype]
        if "device" in kwargs:
            kwargs["device"] = _to_cpu_device(kwargs["device"])
        kwargs.pop("pin_memory", None)  # pinned host memory only serves async copies to a GPU
        if func is torch.Tensor.to and len(args) > 1:
            args = (args[0], _to_cpu_device(args[1]), *args[2:])
        return func(*args, **kwargs)


class _HostStream:
    """A CUDA stream stand-in: CPU ops run in order, so every wait is already satisfied."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.device = _CPU

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> _HostEvent:
        return event if event is not None else _HostEvent()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


class _HostEvent:
    """A CUDA event stand-in (see :class:`_HostStream`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


_HOST_STREAM = _HostStream()


def _patch_torch_cuda() -> None:
    cuda = torch.cuda
    # A device, not an index: autograd runs backward functions outside the mode (torch does not
    # carry function modes into the engine), and megatron's backward passes allocate on it.
    cuda.current_device = lambda: _CPU
    cuda.current_stream = lambda device=None: _HOST_STREAM
    cuda.default_stream = lambda device=None: _HOST_STREAM
    cuda.Stream = _HostStream
    cuda.Event = _HostEvent
    cuda.stream = lambda stream=None: contextlib.nullcontext()
    cuda.set_stream = lambda stream: None
    cuda.synchronize = lambda device=None: None
    cuda.empty_cache = lambda: None
    cuda.set_device = lambda device: None


def _patch_moe_split_sizes() -> None:
    """The all-to-all dispatcher makes its split sizes host (numpy) arrays only when they live on
    CUDA; gloo's ``all_to_all_single`` rejects tensors, in forward and in backward (where the
    mode does not reach), so CPU tensors become numpy arrays too."""
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    original = moe_utils.maybe_move_tensor_to_cpu

    def to_host(tensor, as_numpy=False, record_stream=False):  # noqa: ANN001, ANN202 - megatron's signature
        if as_numpy and torch.is_tensor(tensor) and not tensor.is_cuda:
            return tensor.numpy()
        return original(tensor, as_numpy=as_numpy, record_stream=record_stream)

    moe_utils.maybe_move_tensor_to_cpu = to_host
    token_dispatcher.maybe_move_tensor_to_cpu = to_host


def _patch_rng_tracker() -> None:
    from megatron.core.tensor_parallel import random as mp_random

    class CpuRNGStatesTracker(mp_random.CudaRNGStatesTracker):
        """Megatron's named RNG streams, kept as CPU generator states."""

        def add(self, name: str, seed: int) -> None:
            if seed in self.seeds_:
                raise RuntimeError(f"seed {seed} already exists")
            if name in self.states_:
                raise RuntimeError(f"rng state {name} already exists")
            self.seeds_.add(seed)
            saved = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(saved)

        @contextlib.contextmanager
        def fork(self, name: str = mp_random._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
            if name not in self.states_:
                raise RuntimeError(f"rng state {name} is not added")
            saved = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(saved)

    mp_random.CudaRNGStatesTracker = CpuRNGStatesTracker
    mp_random._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    mp_random._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
    mp_random.initialize_rng_tracker(force_reset=True)


def _patch_missing_transformer_engine() -> None:
    """megatron 0.16's MoE router reads ``te_general_gemm``, bound only when TE imports: bind None."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def ensure_applied() -> bool:
    """Apply the CPU stand-ins once per process when no GPU is present; True when they are active.

    The one fix that is not about CUDA (a name megatron leaves unbound without transformer-engine,
    which breaks its MoE router on any machine) is applied on GPUs too.
    """
    global _APPLIED
    with _LOCK:
        _patch_missing_transformer_engine()
        if torch.cuda.is_available():
            return False
        if not _APPLIED:
            _patch_torch_cuda()
            _patch_rng_tracker()
            _patch_moe_split_sizes()
            _CpuAsCudaMode().__enter__()  # entered for the life of the process, never exited
            _APPLIED = True
    return True
