"""Megatron DDP wrapping, the (distributed) optimizer and the LR schedule of the policy.

Gradient reduction contract (relied on by ``policy.py``): megatron's DDP averages gradients over
the data x context parallel group and its schedule divides each micro-batch loss by the number of
micro-batches; ``finalize_model_grads`` (which :func:`wrap_ddp` installs as
``config.finalize_model_grads_func`` — without it the data-parallel all-reduce is silently
skipped) does the reduction once per step after the last micro-batch.
"""

from __future__ import annotations

import warnings
from functools import partial

import torch

from hetrl.config.trainer import TrainerConfig


def wrap_ddp(model: torch.nn.Module, trainer_cfg: TrainerConfig, pg_collection: object):
    """``model`` in megatron's ``DistributedDataParallel`` with fp32 gradient buffers."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,
        use_distributed_optimizer=use_distributed_optimizer(trainer_cfg),
        check_for_nan_in_grad=False,
    )
    ddp = DistributedDataParallel(config=model.config, ddp_config=ddp_config, module=model, pg_collection=pg_collection)
    ddp.config.finalize_model_grads_func = partial(_finalize, finalize_model_grads)
    ddp.config.no_sync_func = ddp.no_sync
    return ddp


def _finalize(finalize_model_grads, model, num_tokens=None, pg_collection=None, force_all_reduce=False):  # noqa: ANN001
    """megatron's finalize with the groups the schedule passes (None: parallel_state's)."""
    return finalize_model_grads(model, num_tokens, pg_collection=pg_collection, force_all_reduce=force_all_reduce)


def use_distributed_optimizer(trainer_cfg: TrainerConfig) -> bool:
    """The distributed optimizer shards state with reduce-scatter; gloo (CPU) lacks it."""
    if trainer_cfg.distributed_optimizer and not torch.cuda.is_available():
        warnings.warn(
            "trainer.distributed_optimizer is ignored on CPU (gloo has no reduce-scatter): optimizer state is "
            "replicated",
            stacklevel=3,
        )
        return False
    return trainer_cfg.distributed_optimizer


# noqa: ANN001
def build_optimizer(ddp_model, trainer_cfg: TrainerConfig, *, total_steps: int | None, pg_collection: object):
    """``(optimizer, scheduler)``: megatron AdamW with global grad-norm clipping, and its LR schedule.

    Warmup is linear from 0 to ``lr`` over ``lr_warmup_steps``; then ``lr_decay_style`` decays to
    ``min_lr`` at ``lr_decay_steps`` (default: ``total_steps``; constant needs neither).
    """
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    bf16 = trainer_cfg.precision == "bf16"
    config = OptimizerConfig(
        optimizer="adam",
        lr=trainer_cfg.lr,
        min_lr=trainer_cfg.min_lr,
        weight_decay=trainer_cfg.weight_decay,
        adam_beta1=trainer_cfg.adam_beta1,
        adam_beta2=trainer_cfg.adam_beta2,
        adam_eps=trainer_cfg.adam_eps,
        clip_grad=trainer_cfg.grad_clip,
        bf16=bf16,
        params_dtype=torch.bfloat16 if bf16 else torch.float32,
        use_distributed_optimizer=use_distributed_optimizer(trainer_cfg),
    )
    optimizer = get_megatron_optimizer(config, [ddp_model], use_gloo_process_groups=False, pg_collection=pg_collection)
    use_fused_adam(optimizer)
    decay_steps = trainer_cfg.lr_decay_steps or total_steps
    if trainer_cfg.lr_decay_style != "constant" and not decay_steps:
        raise ValueError(
            f"trainer.lr_decay_style={trainer_cfg.lr_decay_style!r} needs trainer.lr_decay_steps or the run's total "
            f"steps"
        )
    decay_steps = max(decay_steps or 0, trainer_cfg.lr_warmup_steps + 1)
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=trainer_cfg.lr,
        min_lr=trainer_cfg.min_lr,
        lr_warmup_steps=trainer_cfg.lr_warmup_steps,
        lr_decay_steps=decay_steps,
        lr_decay_style=trainer_cfg.lr_decay_style,
        start_wd=trainer_cfg.weight_decay,
        end_wd=trainer_cfg.weight_decay,
        wd_incr_steps=decay_steps,
        wd_incr_style="constant",
        use_checkpoint_opt_param_scheduler=True,  # a resumed run continues the schedule it saved
    )
    return optimizer, scheduler


def use_fused_adam(optimizer) -> None:  # noqa: ANN001 - a megatron optimizer
    """Step torch's Adam(W) with its fused kernel, where megatron falls back to torch's optimizer.

    Without transformer-engine or apex (on CPU), megatron builds ``torch.optim.AdamW`` with torch's
    defaults: off CUDA that is the per-parameter loop, six passes over every parameter. The fused
    kernel makes one: at ~44M parameters on 2 CPU cores a step takes ~25 ms instead of ~130 ms.
    ``fused`` is a param-group option, and a loaded optimizer state brings back the groups it saved
    (unfused in a checkpoint of an earlier hetrl), so :func:`hetrl.trainer.checkpoint.load_checkpoint`
    calls this again after loading.
    """
    inner = getattr(optimizer, "chained_optimizers", [optimizer])
    for torch_optimizer in (getattr(part, "optimizer", None) for part in inner):
        if not isinstance(torch_optimizer, torch.optim.Adam | torch.optim.AdamW):
            continue  # transformer-engine's or apex's fused Adam, or no parameters on this rank
        params = [param for group in torch_optimizer.param_groups for param in group["params"]]
        if all(param.device.type in ("cpu", "cuda") for param in params):  # where this torch has the kernel
            for group in torch_optimizer.param_groups:
                group.update(fused=True, foreach=False)
            for param in params:  # the fused kernel reads its step count where the parameter lives
                if "step" in (state := torch_optimizer.state.get(param, {})):
                    state["step"] = torch.as_tensor(state["step"], dtype=torch.float32, device=param.device)
