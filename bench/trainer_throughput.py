"""Trainer tokens/s: hetrl's megatron PolicyTrainer vs a plain PyTorch step of the same model.

Both sides train the same ~10M-parameter Llama-style model (RoPE, RMSNorm, SwiGLU, GQA) on the
same batch of 8 sequences x 128 tokens, fp32 (weights, gradients and optimizer state), one
process, one thread:

* contender: ``PolicyTrainer.train_step`` (megatron GPTModel in megatron DDP, vocab-parallel
  log-probs, the GRPO loss of ``hetrl.trainer.algorithms``, megatron's optimizer with grad
  clipping), old log-probs given so that both sides do exactly one forward + backward + update;
* baseline: HF ``LlamaForCausalLM`` (sdpa attention), ``log_softmax`` + gather, a masked
  policy-gradient loss, ``clip_grad_norm_`` and ``torch.optim.AdamW``.

The optimizer is the same on both sides, so that the ratio measures the trainer and not an
optimizer handicap: without transformer-engine or apex megatron steps ``torch.optim.AdamW``, which
hetrl switches to torch's fused kernel (``hetrl.trainer.optim.use_fused_adam``); the baseline
builds the same fused ``AdamW`` with the contender's ``TrainerConfig`` (lr, betas, eps, weight
decay, grad-norm clip). The bench reads both optimizers' settings back and stops if they differ.

Steps alternate between the two (machine load drifts hit both alike) and each pair is printed;
the headline is the ratio of median tokens/s (contender / baseline), higher is better.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import torch

from hetrl.config.trainer import TrainerConfig

SEQS, PROMPT, COMPLETION = 8, 32, 96
MODEL = dict(
    vocab_size=8192,
    hidden_size=256,
    num_layers=8,
    num_attention_heads=8,
    num_query_groups=4,
    ffn_hidden_size=688,
    max_position_embeddings=256,
)


def make_samples():
    from hetrl.records import Sample

    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(SEQS):
        ids = torch.randint(1, MODEL["vocab_size"], (PROMPT + COMPLETION,), generator=gen).tolist()
        out.append(
            Sample(
                sample_id=f"s{i}",
                group_id=f"g{i // 4}",
                task_name="bench",
                prompt_ids=ids[:PROMPT],
                completion_ids=ids[PROMPT:],
                loss_mask=[1] * COMPLETION,
                logprobs=[-2.0] * COMPLETION,
                versions=[0] * COMPLETION,
            )
        )
    return out


# what decides an Adam step's result and speed; megatron's groups differ only in keys of its own (wd_mult, max_lr)
OPTIMIZER_SETTINGS = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "fused", "foreach", "capturable")


def optimizer_settings(optimizer: torch.optim.Optimizer) -> set[tuple]:
    """The optimizer's class and the distinct settings of its param groups."""
    return {
        (type(optimizer).__name__, *((key, group.get(key)) for key in OPTIMIZER_SETTINGS))
        for group in optimizer.param_groups
    }


def build_contender(samples, advantages, trainer_cfg: TrainerConfig):
    from hetrl.config.algorithm import AlgorithmConfig
    from hetrl.config.model import ModelConfig
    from hetrl.trainer.policy import PolicyTrainer

    trainer = PolicyTrainer(
        ModelConfig(arch="llama", **MODEL),
        trainer_cfg,
        AlgorithmConfig(name="grpo", group_size=4, is_correction="none"),
        with_reference=False,
    )
    batch = trainer.make_batch(samples).with_advantages(torch.as_tensor(advantages))
    old = trainer.compute_logprobs(batch)
    num_params = sum(p.numel() for p in trainer.module.parameters())
    # megatron's ChainedOptimizer -> its FP32Optimizer(s) -> the torch optimizer that steps
    (torch_optimizer,) = (part.optimizer for part in trainer.optimizer.chained_optimizers)
    return (lambda: trainer.train_step(batch, old_logprobs=old)), num_params, torch_optimizer


def build_baseline(samples, advantages, trainer_cfg: TrainerConfig):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=MODEL["vocab_size"],
        hidden_size=MODEL["hidden_size"],
        intermediate_size=MODEL["ffn_hidden_size"],
        num_hidden_layers=MODEL["num_layers"],
        num_attention_heads=MODEL["num_attention_heads"],
        num_key_value_heads=MODEL["num_query_groups"],
        max_position_embeddings=MODEL["max_position_embeddings"],
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config).float().train()
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=trainer_cfg.lr,
        betas=(trainer_cfg.adam_beta1, trainer_cfg.adam_beta2),
        eps=trainer_cfg.adam_eps,
        weight_decay=trainer_cfg.weight_decay,
        fused=True,
        foreach=False,
    )
    tokens = torch.tensor([s.prompt_ids + s.completion_ids for s in samples])
    mask = torch.zeros(SEQS, PROMPT + COMPLETION - 1)
    mask[:, PROMPT - 1 :] = 1.0
    adv = torch.as_tensor(advantages)[:, None]
    with torch.no_grad():
        old = torch.log_softmax(model(tokens).logits[:, :-1].float(), -1).gather(-1, tokens[:, 1:, None])[..., 0]

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        logp = torch.log_softmax(model(tokens).logits[:, :-1].float(), -1).gather(-1, tokens[:, 1:, None])[..., 0]
        ratio = (logp - old).exp()
        per_token = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
        ((per_token * mask).sum() / mask.sum()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), trainer_cfg.grad_clip)
        optimizer.step()

    return step, sum(p.numel() for p in model.parameters()), optimizer


def timed(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=9, help="measured steps per side (after one warm-up step)")
    args = parser.parse_args()
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"), RANK="0", WORLD_SIZE="1"
    )
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    samples = make_samples()
    advantages = [1.0, -1.0, 0.5, -0.5, 0.25, -0.25, 2.0, -2.0]
    trainer_cfg = TrainerConfig(precision="fp32", lr=1e-5, micro_batch_size=SEQS)
    contender, n_contender, optimizer_c = build_contender(samples, advantages, trainer_cfg)
    baseline, n_baseline, optimizer_b = build_baseline(samples, advantages, trainer_cfg)
    if optimizer_settings(optimizer_c) != optimizer_settings(optimizer_b):
        raise SystemExit(
            f"the two sides' optimizers differ: megatron {optimizer_settings(optimizer_c)} vs torch "
            f"{optimizer_settings(optimizer_b)}"
        )
    tokens = SEQS * (PROMPT + COMPLETION)
    print(
        f"params: megatron {n_contender / 1e6:.2f}M, torch {n_baseline / 1e6:.2f}M; batch {SEQS} x "
        f"{PROMPT + COMPLETION} tokens, fp32, 1 thread"
    )
    (settings,) = optimizer_settings(optimizer_b)
    print(
        f"optimizer, the same on both sides: torch.optim.{settings[0]} "
        f"{', '.join(f'{key}={value}' for key, value in settings[1:])}; grad-norm clip {trainer_cfg.grad_clip:g}"
    )
    timed(contender), timed(baseline)  # warm-up
    times_c, times_b = [], []
    for i in range(args.steps):
        times_c.append(timed(contender))
        times_b.append(timed(baseline))
        ratio = times_b[-1] / times_c[-1]
        print(f"step {i}: megatron {times_c[-1]:.3f} s, torch {times_b[-1]:.3f} s (ratio {ratio:.2f}x)")
    tps_c, tps_b = tokens / statistics.median(times_c), tokens / statistics.median(times_b)
    print(f"megatron PolicyTrainer: median {statistics.median(times_c):.3f} s/step, {tps_c:.0f} tokens/s")
    print(
        f"plain PyTorch (HF Llama + fused AdamW): median {statistics.median(times_b):.3f} s/step, {tps_b:.0f} tokens/s"
    )
    print(f"trainer_throughput: {tps_c / tps_b:.2f}x (goal >= 0.9x)")


if __name__ == "__main__":
    main()
