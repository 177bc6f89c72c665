"""The orchestrator's side of checkpoints: what the loop saves, when, and how a run resumes.

A checkpoint is taken only at a step boundary (the safe point), by the trainer ranks, with the
loop state the orchestrator hands them (:class:`LoopState` plus ``Orchestrator.state_dict()``).
It lives under ``RUN_DIR/checkpoints/step_<policy version>``. Resuming (``checkpoint.resume:
auto``) is decided by the orchestrator alone, so no two ranks can disagree on which checkpoint
is current: it sends :class:`Restore` to the trainer (its leader shares it with every trainer
rank), gets the loop state back, restores
its own and lets the engines take the loaded weights (they start from the initial policy).

In the ``sync`` schedule nothing is in flight at a boundary, so a resumed run continues exactly as
the uninterrupted one would have (tasks, sample ids, seeds, weights, optimizer, RNG). Under the
overlapping schedules the groups in flight at the checkpoint are generated again first, with the
restored policy and under their group ids: no task is skipped.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hetrl.config.loop import CheckpointConfig
from hetrl.control import liveness, rundir
from hetrl.control.comm import RoleContext, Tag, recv
from hetrl.control.protocol import Checkpoint, CheckpointDone, Restore, Restored, TrainerLayout
from hetrl.loop import preempt
from hetrl.loop.orchestrator import Orchestrator

logger = logging.getLogger(__name__)
_TRAINER_REPLY_TIMEOUT_S = 3600.0


@dataclass
class LoopState:
    """The driver's progress; with the orchestrator's state, everything a continuation needs."""

    warm_steps_done: int = 0
    rl_steps_done: int = 0
    demo_stream: dict[str, Any] | None = None  # warm-start task cursor
    summary: dict[str, Any] = field(default_factory=dict)  # eval results so far (before, after warm start)
    trained_before: int = 0  # samples trained on by earlier (pre-empted) processes of this run


def _trainer_reply(ctx: RoleContext, orch: Orchestrator, expected: type) -> Any:
    """Wait for trainer rank 0's answer (the only trainer rank that talks to the orchestrator). Its layout, which
    it announces once at start, may come first: the orchestrator keeps it."""
    liveness.idle(f"the trainer's {expected.__name__}")
    deadline = time.monotonic() + _TRAINER_REPLY_TIMEOUT_S
    while True:
        timeout_s = max(0.0, deadline - time.monotonic())
        message, _, _ = recv(ctx.world, ctx.plan.ranks_of("trainer")[0], Tag.RESULT, timeout_s=timeout_s)
        if isinstance(message, expected):
            return message
        if not isinstance(message, TrainerLayout):
            raise TypeError(f"expected {expected.__name__} from the trainer, got {type(message).__name__}")
        orch.layout = message


def save(ctx: RoleContext, orch: Orchestrator, state: LoopState) -> str:
    """Have the trainer ranks checkpoint the current version with the loop state; its path."""
    saved = LoopState(**{**asdict(state), "trained_before": state.trained_before + len(orch.ledger.trained)})
    loop_state = {"loop": asdict(saved), "orchestrator": orch.state_dict()}
    orch.to_trainer(Checkpoint(orch.version, loop_state))
    path = _trainer_reply(ctx, orch, CheckpointDone).path
    logger.info("checkpoint of v%d at %s", orch.version, path)
    return path


def resume(ctx: RoleContext, cfg: CheckpointConfig, orch: Orchestrator, run_dir: Path) -> LoopState:
    """Restore the latest checkpoint of the run directory if there is one (and resume is on)."""
    from hetrl.trainer.checkpoint import latest_checkpoint  # lazy: torch, which the orchestrator never loads

    path = latest_checkpoint(rundir.checkpoint_root(run_dir)) if cfg.resume == "auto" else None
    if path is None:
        return LoopState()
    orch.to_trainer(Restore(str(path)))
    restored = _trainer_reply(ctx, orch, Restored)
    orch.load_state_dict(restored.loop_state["orchestrator"])
    if orch.version != restored.version:
        raise RuntimeError(f"checkpoint {path} holds weights v{restored.version} but loop state of v{orch.version}")
    orch.sync_engines(restored.version)  # the trainer is pushing the loaded weights now
    state = LoopState(**restored.loop_state["loop"])
    print(
        f"[hetrl] resumed from {path}: policy v{orch.version}, {state.warm_steps_done} warm-start and "
        f"{state.rl_steps_done} RL steps done",
        flush=True,
    )
    return state


def safe_point(ctx: RoleContext, orch: Orchestrator, state: LoopState) -> None:
    """Between two steps: on a pre-emption signal, checkpoint and stop (raises :class:`preempt.Preempted`)."""
    signum = preempt.requested(ctx)
    if signum is None:
        return
    path = save(ctx, orch, state)
    print(
        f"[hetrl] pre-empted (signal {signum}) after {state.rl_steps_done} RL steps: checkpoint {path}; "
        f"exiting with {rundir.REQUEUE_EXIT_CODE} for a requeue",
        flush=True,
    )
    raise preempt.Preempted(signum, path)
