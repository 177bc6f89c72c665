"""Rollout throughput: hetrl's vLLM engine vs HF ``generate`` on the same ~44M-param model and prompts.

Both sample in fp32 on this machine's cores, one after the other in one run, two workloads:

* **long-tail** (the headline): each of the prompts x n samples has its own response length,
  drawn from a seeded log-normal capped at ``--max-new-tokens``, as RL rollouts do (most answers
  short, a few long). The engine stops each sample at its length and fills the freed slots;
  ``generate`` decodes the batch until its longest sample is done. Only each sample's own tokens
  count, on both sides.
* **equal-length**: every sample ``--new-tokens`` long (EOS ignored), HF's best case.

The headline is engine tokens/s over HF tokens/s on the long-tail workload.

    python bench/rollout_throughput.py [--prompts 32] [--n 8] [--new-tokens 64] [--max-new-tokens 160]
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
from hetrl.records import GenerationRequest, SamplingParams
from hetrl.rollout.engine import checkpoint_weights

MODEL = ModelConfig(
    hidden_size=512,
    num_layers=12,
    num_attention_heads=8,
    num_query_groups=4,
    ffn_hidden_size=1408,
    vocab_size=8192,
    max_position_embeddings=512,
)


def make_prompts(num: int, length: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(4, 100, (length,), generator=generator).tolist() for _ in range(num)]


def response_lengths(num: int, cap: int, seed: int = 1) -> list[int]:
    """Long-tailed response lengths: log-normal with median cap / 6, between 4 and ``cap``."""
    generator = torch.Generator().manual_seed(seed)
    draws = torch.exp(torch.randn(num, generator=generator) * 0.8 + math.log(cap / 6))
    return draws.round().clamp(4, cap).long().tolist()


def hf_tokens_per_s(path: Path, prompts: list[list[int]], n: int, lengths: list[int]) -> float:
    """Useful tokens/s of one batched ``generate`` call: it runs until the longest sample is done."""
    import transformers

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor(prompts)
    longest = max(lengths)
    kwargs = dict(
        do_sample=True, temperature=1.0, top_k=0, max_new_tokens=longest, min_new_tokens=longest, num_return_sequences=n
    )
    with torch.no_grad():
        model.generate(
            ids[:2], attention_mask=torch.ones_like(ids[:2]), **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4}
        )
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        elapsed = time.perf_counter() - start
    assert (out.shape[1] - ids.shape[1]) * out.shape[0] == len(prompts) * n * longest
    return sum(lengths) / elapsed


def engine_tokens_per_s(path: Path, prompts: list[list[int]], n: int, lengths: list[int]) -> float:
    """Tokens/s of the engine with every sample a request of its own length (continuous batching)."""
    from hetrl.rollout.engine import GenerationEngine

    cfg = RolloutConfig(
        max_model_len=512, kv_cache_memory_mb=2048, max_num_seqs=len(prompts) * n, max_num_batched_tokens=8192
    )
    engine = GenerationEngine(path, cfg, dtype="float32", seed=0)
    engine.generate([GenerationRequest(f"warm{i}", p, SamplingParams(max_tokens=4)) for i, p in enumerate(prompts[:4])])
    requests = [
        GenerationRequest(
            f"r{i}.{j}", prompt, SamplingParams(temperature=1.0, max_tokens=lengths[i * n + j], ignore_eos=True)
        )
        for i, prompt in enumerate(prompts)
        for j in range(n)
    ]
    start = time.perf_counter()
    results = engine.generate(requests)
    elapsed = time.perf_counter() - start
    engine.shutdown()
    generated = sum(len(r.response_ids) for r in results)
    assert generated == sum(lengths)
    return generated / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument(
        "--new-tokens", type=int, default=64, help="length of every sample in the equal-length workload"
    )
    parser.add_argument("--max-new-tokens", type=int, default=160, help="cap of the long-tail workload's lengths")
    parser.add_argument("--prompt-len", type=int, default=32)
    args = parser.parse_args()
    samples = args.prompts * args.n
    workloads = {
        "equal-length": [args.new_tokens] * samples,
        "long-tail": response_lengths(samples, args.max_new_tokens),
    }
    ratios = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = build_random_hf_checkpoint(MODEL, Path(tmp) / "model", seed=0)
        num_params = sum(math.prod(shape) for shape, _ in checkpoint_weights(path).values())
        prompts = make_prompts(args.prompts, args.prompt_len)
        print(f"model: {num_params / 1e6:.1f}M params fp32; {args.prompts} prompts x n={args.n}")
        for name, lengths in workloads.items():
            hf = hf_tokens_per_s(path, prompts, args.n, lengths)
            eng = engine_tokens_per_s(path, prompts, args.n, lengths)
            ratios[name] = eng / hf
            print(
                f"{name} (lengths {min(lengths)}-{max(lengths)}, mean {sum(lengths) / len(lengths):.0f}): "
                f"HF generate {hf:.0f} tokens/s, hetrl engine (vLLM) {eng:.0f} tokens/s, {eng / hf:.2f}x"
            )
    print(f"rollout_throughput: {ratios['long-tail']:.2f}x (goal >=2x)")


if __name__ == "__main__":
    main()
