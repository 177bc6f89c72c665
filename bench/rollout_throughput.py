"""Rollout throughput: hetrl's vLLM engine vs HF ``generate`` on the same ~44M-param model and prompts.

Both sample the same workload (prompts x n samples x new tokens, EOS ignored so every sample has
the same length) in fp32 on this machine's cores, one after the other in one run. The headline is
engine tokens/s over HF tokens/s.

    python bench/rollout_throughput.py [--prompts 32] [--n 8] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from pathlib import Path

import torch

from hetrl.config.model import ModelConfig
from hetrl.config.rollout import RolloutConfig
from hetrl.models.hf import build_random_hf_checkpoint
from hetrl.rollout.engine import checkpoint_weights
from hetrl.types import GenerationRequest, SamplingParams

MODEL = ModelConfig(
    hidden_size=512, num_layers=12, num_attention_heads=8, num_query_groups=4, ffn_hidden_size=1408, vocab_size=8192, max_position_embeddings=512
)


def make_prompts(num: int, length: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(4, 100, (length,), generator=generator).tolist() for _ in range(num)]


def hf_tokens_per_s(path: Path, prompts: list[list[int]], n: int, new_tokens: int) -> float:
    import transformers

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor(prompts)
    kwargs = dict(do_sample=True, temperature=1.0, top_k=0, max_new_tokens=new_tokens, min_new_tokens=new_tokens, num_return_sequences=n)
    with torch.no_grad():
        model.generate(ids[:2], attention_mask=torch.ones_like(ids[:2]), **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        elapsed = time.perf_counter() - start
    generated = (out.shape[1] - ids.shape[1]) * out.shape[0]
    assert generated == len(prompts) * n * new_tokens
    return generated / elapsed


def engine_tokens_per_s(path: Path, prompts: list[list[int]], n: int, new_tokens: int) -> float:
    from hetrl.rollout.engine import GenerationEngine

    cfg = RolloutConfig(max_model_len=512, kv_cache_memory_mb=2048, max_num_seqs=len(prompts) * n, max_num_batched_tokens=8192)
    engine = GenerationEngine(path, cfg, seed=0)
    sampling = SamplingParams(n=n, temperature=1.0, max_tokens=new_tokens, ignore_eos=True)
    engine.generate([GenerationRequest(f"warm{i}", p, SamplingParams(max_tokens=4)) for i, p in enumerate(prompts[:4])])
    start = time.perf_counter()
    results = engine.generate([GenerationRequest(f"r{i}", p, sampling) for i, p in enumerate(prompts)])
    elapsed = time.perf_counter() - start
    engine.shutdown()
    generated = sum(len(r.response_ids) for r in results)
    assert generated == len(prompts) * n * new_tokens
    return generated / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = build_random_hf_checkpoint(MODEL, Path(tmp) / "model", seed=0)
        num_params = sum(math.prod(shape) for shape, _ in checkpoint_weights(path).values())
        prompts = make_prompts(args.prompts, args.prompt_len)
        print(f"model: {num_params / 1e6:.1f}M params fp32; workload: {args.prompts} prompts x n={args.n} x {args.new_tokens} new tokens")
        hf = hf_tokens_per_s(path, prompts, args.n, args.new_tokens)
        print(f"HF generate: {hf:.0f} tokens/s")
        eng = engine_tokens_per_s(path, prompts, args.n, args.new_tokens)
        print(f"hetrl engine (vLLM): {eng:.0f} tokens/s")
    print(f"rollout_throughput: {eng / hf:.2f}x (goal >=2x)")


if __name__ == "__main__":
    main()
