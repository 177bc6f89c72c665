"""``ValueTrainer``: PPO's value model (the critic), trained beside the policy on the same ranks.

The critic is the policy's architecture with a scalar head (:class:`hetrl.trainer.model.ValueHead`)
in the trainer's TP/PP/CP/DP layout and process groups, so it takes the policy's micro-batches as
they are: ``compute_values`` and ``train_step`` use the :class:`hetrl.trainer.batch.TrainBatch` that
:meth:`hetrl.trainer.policy.PolicyTrainer.make_batch` built. It has its own optimizer and LR
schedule (``critic.lr``; the rest of ``trainer.*``), and its loss never mixes with the policy's.

Values are read where the policy's log-probs are: the value of completion token ``j`` is the head's
output at the position that predicts ``j`` (the state the token was chosen in), in sample space
``[N, Tc]`` over the step's full batch, 0 off the loss mask.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import Tensor

from hetrl.config.algorithm import AlgorithmConfig
from hetrl.config.critic import CriticConfig
from hetrl.config.model import ModelConfig
from hetrl.config.trainer import TrainerConfig
from hetrl.monitor import names
from hetrl.trainer.algorithms import compute_value_loss
from hetrl.trainer.batch import MicroBatch, TrainBatch
from hetrl.trainer.hf_convert import load_hf_checkpoint
from hetrl.trainer.logprobs import forward_values, run_schedule, sample_values
from hetrl.trainer.model import build_gpt_model
from hetrl.trainer.optim import build_optimizer, wrap_ddp
from hetrl.trainer.parallel import ParallelGroups
from hetrl.trainer.policy import global_counts, reduce_metrics, to_global


class ValueTrainer:
    """The value model (megatron ``GPTModel`` with a value head, in DDP), its optimizer and LR schedule.

    ``groups`` are the policy's (one layout for both models); ``total_steps`` sizes the LR decay
    like the policy's; ``max_len`` is the Dr.GRPO normaliser when the aggregation needs it.
    """

    def __init__(
        self,
        model_cfg: ModelConfig,
        trainer_cfg: TrainerConfig,
        critic_cfg: CriticConfig,
        algo_cfg: AlgorithmConfig,
        groups: ParallelGroups,
        *,
        seed: int = 1234,
        total_steps: int | None = None,
        max_len: int | None = None,
    ) -> None:
        self.algo_cfg, self.groups, self.max_len = algo_cfg, groups, max_len
        self.trainer_cfg = trainer_cfg.model_copy(
            update={"lr": critic_cfg.lr, "min_lr": min(trainer_cfg.min_lr, critic_cfg.lr)}
        )
        # Another seed than the policy's: a fresh critic's body must not be the fresh policy's.
        module = build_gpt_model(
            model_cfg, self.trainer_cfg, pg_collection=groups.pg_collection, seed=seed + 1, value_head=True
        )
        self.model = wrap_ddp(module, self.trainer_cfg, groups.pg_collection)
        self.optimizer, self.scheduler = build_optimizer(
            self.model, self.trainer_cfg, total_steps=total_steps, pg_collection=groups.pg_collection
        )

    @property
    def module(self) -> torch.nn.Module:
        """The unwrapped value ``GPTModel`` of this rank (what checkpoints read)."""
        return self.model.module

    def load_initial_weights(self, init: str, policy_hf_dir: str | Path) -> None:
        """Start from ``critic.init``: the policy's HF checkpoint (body only), an HF token-classification
        checkpoint (body and ``score`` head), or the fresh draw (``fresh``). Collective over the trainer ranks."""
        if init == "fresh":
            return
        if init == "policy":
            load_hf_checkpoint(self.module, policy_hf_dir, self.groups.pg_collection, body_only=True)
        else:
            load_hf_checkpoint(self.module, init, self.groups.pg_collection)
        self.optimizer.reload_model_params()  # fp32 master weights (bf16) start from the imported values

    def compute_values(self, batch: TrainBatch) -> Tensor:
        """Sample-space values ``[N, Tc]`` of the full batch (the same tensor on every rank)."""
        return to_global(forward_values(self.model, batch, self.groups), batch, self.groups)

    def train_step(self, batch: TrainBatch, *, old_values: Tensor, returns: Tensor) -> dict[str, float]:
        """One optimizer step of the value loss on the batch (full-batch, sample-space ``old_values`` and ``returns``).

        Metrics: ``loss/value``, ``value/clip_frac``, ``value/mean`` summed over the step like the
        policy's, and the critic's ``critic/grad_norm``, ``critic/lr``.
        """
        start = time.perf_counter()
        num_tokens, num_seqs = global_counts(batch, self.groups)
        local_old, local_returns = old_values[batch.global_indices], returns[batch.global_indices]
        scale = len(batch.micro_batches) * self.groups.dp_size  # as in PolicyTrainer.train_step

        def loss_func(mb: MicroBatch, output: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            values = sample_values(output, mb, self.groups)
            loss, metrics = compute_value_loss(
                self.algo_cfg,
                values,
                batch.gather(local_old, mb),
                batch.gather(local_returns, mb),
                mb.loss_mask.to(values.device),
                num_global_tokens=num_tokens,
                num_global_seqs=num_seqs,
                max_len=self.max_len,
            )
            return loss * scale, {k: v.detach().float() for k, v in metrics.items()}

        self.optimizer.zero_grad()
        self.model.zero_grad_buffer()
        stored = run_schedule(self.model, batch, self.groups, loss_func, forward_only=False)
        self.scheduler.step(increment=1)
        _, grad_norm, _ = self.optimizer.step()
        metrics = reduce_metrics(stored, self.groups)
        metrics.update(
            {
                names.CRITIC_GRAD_NORM: float(grad_norm) if grad_norm is not None else 0.0,
                names.CRITIC_LEARNING_RATE: float(self.optimizer.param_groups[0]["lr"]),
                names.CRITIC_STEP_S: time.perf_counter() - start,
            }
        )
        return metrics
