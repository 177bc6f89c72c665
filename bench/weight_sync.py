"""Weight sync: a whole-model push over the gloo weight-sync group vs an in-memory copy of the same bytes.

Part 1: the ~44M-param rollout model (fp32), pushed from a trainer-side sender to an engine-side
receiver (two ranks of their own gloo group, threads of this process) in buckets of the recipes'
CPU default (``rollout.weight_sync_bucket_mb``: 16 MiB), until the
engine holds the staged, complete push; baseline: ``clone()`` of every tensor (one in-memory copy
of the same bytes, allocation included, as the receiver allocates too). With ``--apply`` it also
times the engine's swap (vLLM ``reload_weights`` + prefix-cache reset).
Part 2: bucketed vs per-tensor transfer of a model made of many small tensors.

    python bench/weight_sync.py [--repeats 5] [--apply]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

from hetrl.transport.weights import bucketize, build_weight_receiver, build_weight_sender, init_weight_sync_group


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class GlooPair:
    """Sender (rank 0, a thread) and receiver (rank 1) of one weight-sync group, reused across pushes."""

    def __init__(self, verify: bool = False) -> None:
        port, holder = free_port(), {}
        thread = threading.Thread(target=lambda: holder.update(group=init_weight_sync_group("127.0.0.1", port, 0, 2)))
        thread.start()
        self.receiver = build_weight_receiver(
            "collective", group=init_weight_sync_group("127.0.0.1", port, 1, 2), verify=verify
        )
        thread.join()
        self.sender = build_weight_sender("collective", group=holder["group"], verify=verify)

    def push(self, state: dict[str, torch.Tensor], bucket_bytes: int, version: int):
        """Seconds from the first byte sent to a complete staged push on the engine side."""
        thread = threading.Thread(target=self.sender.send, args=(bucketize(state.items(), bucket_bytes), version))
        start = time.perf_counter()
        thread.start()
        staged = self.receiver.receive()
        elapsed = time.perf_counter() - start
        thread.join()
        return elapsed, staged


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rollout_model_state(tmp: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    import rollout_throughput
    from safetensors.torch import load_file

    from hetrl.models.hf import build_random_hf_checkpoint

    path = build_random_hf_checkpoint(rollout_throughput.MODEL, tmp / "model", seed=3)
    state = {}
    for file in sorted(path.glob("*.safetensors")):
        state.update(load_file(file))
    return path, state


def whole_model(pair: GlooPair, state: dict[str, torch.Tensor], repeats: int) -> tuple[float, float, object]:
    from hetrl.config.rollout import RolloutConfig

    bucket_bytes = RolloutConfig().weight_sync_bucket_bytes(on_gpu=False)
    pair.push(state, bucket_bytes, 0)  # warm-up: first-touch of gloo's buffers
    pushes = [pair.push(state, bucket_bytes, v + 1) for v in range(repeats)]
    sync_s = statistics.median(t for t, _ in pushes)
    copy_s = median_time(lambda: {name: tensor.clone() for name, tensor in state.items()}, repeats)
    return sync_s, copy_s, pushes[-1][1]


def apply_time(path: Path, staged) -> float:
    from hetrl.config.rollout import RolloutConfig
    from hetrl.rollout.engine import GenerationEngine

    engine = GenerationEngine(path, RolloutConfig(max_model_len=512, kv_cache_memory_mb=128), dtype="float32", seed=0)
    start = time.perf_counter()
    engine.load_weights(staged)
    elapsed = time.perf_counter() - start
    engine.shutdown()
    return elapsed


def many_small(pair: GlooPair, repeats: int) -> tuple[float, float, int]:
    generator = torch.Generator().manual_seed(0)
    state = {f"block.{i}.scale": torch.randn(1024, generator=generator) for i in range(2000)}
    bucketed = statistics.median(pair.push(state, 64 << 20, v)[0] for v in range(repeats))
    per_tensor = statistics.median(pair.push(state, 1, v)[0] for v in range(repeats))
    return bucketed, per_tensor, len(state)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--apply", action="store_true", help="also time the engine-side swap (starts a vLLM engine, ~20 s)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    pair = GlooPair()
    with tempfile.TemporaryDirectory() as tmp:
        path, state = rollout_model_state(Path(tmp))
        num_bytes = sum(t.numel() * t.element_size() for t in state.values())
        sync_s, copy_s, staged = whole_model(pair, state, args.repeats)
        print(
            f"whole model: {len(state)} tensors, {num_bytes / 2**20:.0f} MiB; gloo push {sync_s * 1e3:.0f} ms "
            f"({num_bytes / sync_s / 2**30:.2f} GiB/s), in-memory copy {copy_s * 1e3:.0f} ms"
        )
        verify_s = GlooPair(verify=True).push(state, 16 << 20, 99)[0]
        print(f"with verify (CRC32 both sides): {verify_s * 1e3:.0f} ms")
        if args.apply:
            print(f"engine swap (reload_weights + prefix-cache reset): {apply_time(path, staged) * 1e3:.0f} ms")
    bucketed, per_tensor, count = many_small(pair, args.repeats)
    print(
        f"many small tensors ({count} x 4 KiB): bucketed {bucketed * 1e3:.0f} ms, per-tensor {per_tensor * 1e3:.0f} ms "
        f"({per_tensor / bucketed:.1f}x slower)"
    )
    print(f"weight_sync: {sync_s / copy_s:.2f}x in-memory copy (goal <=3x)")


if __name__ == "__main__":
    main()
