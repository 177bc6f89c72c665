"""TRL's side of bench/vs_trl.py: GRPO with TRL's ``GRPOTrainer`` on hetrl's workload, run in TRL's own venv.

``python trl_grpo_step.py CHECKPOINT TASKS OUT [key=value ...]`` (bench/vs_trl.py starts it; TRL is
never a dependency of hetrl). The key=value words are the recipe overrides of the hetrl run it is
compared with; everything TRL is told comes from that resolved recipe (tiny_grpo), so the two cannot
drift apart:
- the policy starts from CHECKPOINT (an HF dir), the prompts are TASKS (a JSONL that vs_trl.py dumps
  from hetrl's own training stream, with hetrl's prompt token ids, checked against TRL's tokenisation);
- the reward is hetrl's own code: the recipe's rubric (``math`` with answer_tag=answer + 0.5 x
  ``closeness``) scores each completion, decoded as hetrl decodes it, and hetrl's trainer-side DAPO
  overlong penalty (``hetrl.trainer.advantages.overlong_penalty``) is added on the completion length;
- the hyperparameters map one to one (batch, group size, micro-batch, lr, warmup, clip, beta, AdamW,
  grad clip, sampling, precision: trainer.precision=bf16 is TRL's bf16=True, autocast over fp32
  weights); the learning rate follows Megatron's warmup as hetrl runs it (step k gets
  lr x min(1, (k + 1) / warmup)), not HF's constant_with_warmup (which gives step 0 lr 0).
Not mirrored: hetrl's truncated IS correction of the engine/trainer mismatch (TRL samples with the
trained model itself, HF ``generate``, so there is no mismatch to correct), and hetrl's shared-prompt
rows (``trainer.shared_prompts``: each group's prompt computed once; TRL computes it per sample, in
micro-batches of ``trainer.micro_batch_size`` samples).

Writes the final policy with its tokenizer to OUT/model (for ``launch.py eval``) and OUT/timings.json:
the wall time of every step (optimizer step end to step end, as hetrl's ``time/step``) and of its
generation, and per step the mean rubric total (hetrl's ``reward/mean``) and mean response length.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from datasets import Dataset
from torch.optim.lr_scheduler import LambdaLR
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

ROOT = Path(__file__).resolve().parents[1]
# bench/math_verify.py would shadow the math_verify package (hetrl's reward code imports it): src/ in its place
sys.path[:] = [str(ROOT / "src"), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

from hetrl.config.loader import load_config  # noqa: E402
from hetrl.config.schema import HetrlConfig  # noqa: E402
from hetrl.records import Sample  # noqa: E402
from hetrl.reward.rubric import Rubric  # noqa: E402
from hetrl.trainer.advantages import overlong_penalty  # noqa: E402


def grpo_config(cfg: HetrlConfig, out: Path) -> GRPOConfig:
    """TRL's GRPOConfig for the recipe's GRPO step; refuses recipe settings the mapping does not cover."""
    algo, trainer, rollout = cfg.algorithm, cfg.trainer, cfg.rollout
    unmapped = {
        "algorithm.advantage": algo.resolved_advantage != "grpo",
        "algorithm.loss_aggregation": algo.resolved_loss_aggregation != "token-mean",
        "algorithm.dynamic_sampling": algo.resolved_dynamic_sampling,
        "algorithm.kl_in_reward": algo.kl_in_reward,
        "algorithm.entropy_coef": algo.entropy_coef != 0,
        "algorithm.dual_clip": algo.dual_clip is not None,
        "trainer.lr_decay_style": trainer.lr_decay_style != "constant",
        "trainer.updates_per_batch": trainer.updates_per_batch != 1,
        "rollout.stop": bool(rollout.stop),
    }
    if any(unmapped.values()):
        raise SystemExit(f"trl_grpo_step: no TRL mapping for {[key for key, bad in unmapped.items() if bad]}")
    samples = cfg.run.prompts_per_step * algo.group_size
    # TRL's micro-batch: trainer.micro_batch_size samples (with trainer.shared_prompts hetrl's rows are whole groups).
    # Measured on tiny_grpo: TRL's step is the same with micro-batches of 32 or of all 128 samples (0.91 vs 0.92 s).
    micro = min(samples, trainer.micro_batch_size)
    if samples % micro:
        raise SystemExit(f"trl_grpo_step: {samples} samples a step do not split into TRL micro-batches of {micro}")
    return GRPOConfig(
        output_dir=str(out / "trainer"),
        use_cpu=True,
        bf16=trainer.precision == "bf16",
        gradient_checkpointing=trainer.recompute_activations,
        max_steps=cfg.run.steps,
        seed=cfg.run.seed,
        shuffle_dataset=False,  # hetrl's stream order, 16 prompts a step
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=samples // micro,
        num_generations=algo.group_size,
        max_completion_length=rollout.max_tokens,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=max(rollout.top_k, 0),
        learning_rate=trainer.lr,
        warmup_steps=trainer.lr_warmup_steps,
        weight_decay=trainer.weight_decay,
        adam_beta1=trainer.adam_beta1,
        adam_beta2=trainer.adam_beta2,
        adam_epsilon=trainer.adam_eps,
        max_grad_norm=trainer.grad_clip,
        beta=algo.kl_coef,
        epsilon=algo.clip_low,
        epsilon_high=algo.resolved_clip_high,
        loss_type="dapo",  # token-mean over the whole step, as hetrl's token-mean with the step's token count
        scale_rewards="group",
        num_iterations=1,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )


def hetrl_reward(cfg: HetrlConfig, tokenizer, rubric_means: list[float]):
    """A TRL reward function computing hetrl's reward: rubric total + the DAPO overlong penalty.

    Appends each batch's mean rubric total to ``rubric_means``: hetrl's ``reward/mean`` (the
    overlong penalty is shaping, applied in hetrl's trainer and not part of that metric).
    """
    rubric = Rubric.from_config(cfg.reward)
    algo, max_tokens = cfg.algorithm, cfg.rollout.max_tokens

    def reward(prompts, completions, completion_ids, answer, **_) -> list[float]:
        # hetrl's completion_text: the sampled ids decoded with special tokens kept (env.runner / ChatCodec)
        samples = [
            Sample(
                f"trl{i}",
                f"trl{i}",
                "trl",
                [],
                ids,
                [1] * len(ids),
                [0.0] * len(ids),
                [0] * len(ids),
                finish_reason="stop" if ids and ids[-1] == tokenizer.eos_token_id else "length",
                completion_text=tokenizer.decode(ids, skip_special_tokens=False),
                answer=ref,
            )
            for i, (ids, ref) in enumerate(zip(completion_ids, answer, strict=True))
        ]
        scores = torch.tensor([rubric.score(sample).total for sample in samples])
        rubric_means.append(scores.mean().item())
        lengths = torch.tensor([len(ids) for ids in completion_ids])
        if algo.overlong_buffer > 0:
            scores = scores + overlong_penalty(lengths, max_tokens, algo.overlong_buffer, algo.overlong_penalty)
        return scores.tolist()

    reward.__name__ = "hetrl_reward"
    return reward


def load_tasks(path: Path, tokenizer) -> Dataset:
    """The dumped prompts as a conversational dataset; fails if TRL would tokenise them differently from hetrl."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True)[
            "input_ids"
        ]
        if list(ids) != row["prompt_ids"]:
            raise SystemExit(
                f"trl_grpo_step: TRL tokenises {row['prompt']!r} as {list(ids)}, hetrl as {row['prompt_ids']}"
            )
    return Dataset.from_list([{"prompt": row["prompt"], "answer": row["answer"]} for row in rows])


class StepTimer(TrainerCallback):
    """Wall time between optimizer-step ends (the first from the start of training), and the logged response length."""

    def __init__(self) -> None:
        self.step_s: list[float] = []
        self.response_length: list[float] = []
        self._last = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self._last = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.step_s.append(now - self._last)
        self._last = now

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "completions/mean_length" in logs:
            self.response_length.append(float(logs["completions/mean_length"]))


class HetrlScheduleGRPOTrainer(GRPOTrainer):
    """GRPOTrainer with hetrl's warmup and a timer on generation (TRL 1.16's ``_generate_single_turn``)."""

    def __init__(self, *args, warmup_steps: int, **kwargs) -> None:
        self.warmup_steps = warmup_steps
        self.generate_s: list[float] = []
        super().__init__(*args, **kwargs)

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:
            warmup = max(self.warmup_steps, 1)
            self.lr_scheduler = LambdaLR(optimizer or self.optimizer, lambda step: min(1.0, (step + 1) / warmup))
        return self.lr_scheduler

    def _generate_single_turn(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return super()._generate_single_turn(*args, **kwargs)
        finally:
            self.generate_s.append(time.perf_counter() - start)


def main(argv: list[str]) -> None:
    checkpoint, tasks, out, overrides = Path(argv[0]), Path(argv[1]), Path(argv[2]), argv[3:]
    cfg = load_config("tiny_grpo", overrides)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    timer, rubric_means = StepTimer(), []
    trainer = HetrlScheduleGRPOTrainer(
        model=str(checkpoint),
        reward_funcs=hetrl_reward(cfg, tokenizer, rubric_means),
        args=grpo_config(cfg, out),
        train_dataset=load_tasks(tasks, tokenizer),
        processing_class=tokenizer,
        callbacks=[timer],
        warmup_steps=cfg.trainer.lr_warmup_steps,
    )
    trainer.train()
    trainer.save_model(str(out / "model"))
    timings = {
        "step_s": timer.step_s,
        "generate_s": trainer.generate_s,
        "reward": rubric_means,
        "response_length": timer.response_length,
        "threads": torch.get_num_threads(),
    }
    (out / "timings.json").write_text(json.dumps(timings, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
