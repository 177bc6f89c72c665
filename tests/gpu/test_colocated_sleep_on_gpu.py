"""A colocated engine's sleep on a real GPU: the memory it frees for the trainer's step, and what it serves after.

CPU machines skip it (vLLM has no sleep mode there; tests/monitor/test_real_run.py checks the order of the
turns on CPU), and so does a GPU machine without vLLM. One process holds the engine; the trainer's step is
stood in for by an allocation larger than what was free while the engine was awake: a colocated trainer
is another process on the same GPU, and ``torch.cuda.mem_get_info`` reads the whole device's memory.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hetrl.config.rollout import RolloutConfig
from hetrl.models.hf import build_random_hf_checkpoint
from hetrl.records import GenerationRequest, SamplingParams
from hetrl.transport.weights import StagedWeights
from tests.gpu.models import MODEL

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

UTILIZATION = 0.85  # the engine takes most of the GPU: the step below fits only once it has slept
PROMPTS = [[5, 17, 33, 9, 60, 41], [70, 12, 8, 8, 91], [44, 3, 29, 77, 15, 16, 52, 6]]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("vllm", reason="the colocated check needs vLLM on the GPU machine")  # and transformers
    root = tmp_path_factory.mktemp("colocated_models")
    # init_std 0.1 spreads the logits: greedy decoding has no near-ties, so the two models' answers differ
    return {
        name: build_random_hf_checkpoint(MODEL, root / name, seed=seed, init_std=0.1)
        for name, seed in (("a", 1), ("b", 2))
    }


@pytest.fixture(scope="module")
def engine(models):
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    from hetrl.rollout.engine import GenerationEngine

    cfg = RolloutConfig(
        placement="colocated",
        gpu_memory_utilization=UTILIZATION,
        max_model_len=256,
        max_num_seqs=16,
        temperature=0.0,
        enforce_eager=True,
    )
    eng = GenerationEngine(models["a"], cfg, dtype="float32", seed=0)
    yield eng
    eng.shutdown()
    cleanup_dist_env_and_memory()  # vLLM's torch.distributed world: the trainer checks start their own


def _greedy(engine) -> list[list[int]]:
    sampling = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    results = engine.generate([GenerationRequest(f"g{i}", p, sampling) for i, p in enumerate(PROMPTS)])
    return [r.response_ids for r in sorted(results, key=lambda r: r.request_id)]


def _push(engine, model_dir: Path, version: int) -> None:
    """The weights of ``model_dir`` as a push, through the turns the rollout role takes around one."""
    from safetensors.torch import load_file

    tensors = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    engine.release_memory()
    engine.wake("weights")
    engine.load_weights(StagedWeights(version, tensors))
    engine.wake("kv_cache")


def test_the_sleep_frees_the_engines_memory_for_the_train_step(engine):
    assert engine.sleep_mode
    served = _greedy(engine)
    free_awake, total = torch.cuda.mem_get_info()
    engine.release_memory()
    free_asleep, _ = torch.cuda.mem_get_info()
    freed = free_asleep - free_awake
    # Weights and KV cache: most of what vLLM took (its activation peak and the CUDA context stay).
    assert freed > 0.5 * UTILIZATION * total, (free_awake, free_asleep, total)
    # The train step: more memory than was free while the engine was awake.
    step_bytes = free_awake + freed // 2
    block = torch.ones(step_bytes, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    during_step = torch.cuda.mem_get_info()[0]
    assert during_step < free_asleep - step_bytes // 2, (during_step, free_asleep, step_bytes)
    del block
    torch.cuda.empty_cache()
    engine.wake("weights")
    free_weights = torch.cuda.mem_get_info()[0]
    assert free_weights > free_awake + freed // 2, "waking the weights must not bring the KV cache back"
    engine.wake("kv_cache")
    assert abs(torch.cuda.mem_get_info()[0] - free_awake) < 0.05 * total
    assert _greedy(engine) == served, "level 1 keeps the weights in host memory: the engine serves them again"


def test_pushes_through_the_sleep_serve_the_pushed_weights(engine, models):
    served_a = _greedy(engine)
    _push(engine, models["b"], version=engine.version + 1)
    served_b = _greedy(engine)
    assert served_b != served_a
    _push(engine, models["a"], version=engine.version + 1)
    assert _greedy(engine) == served_a
