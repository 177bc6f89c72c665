"""Fault injection for tests of the launcher and the loop's fault tolerance.

``HETRL_INJECT_FAULT=<role>:<role_rank>:<kind>[@<n>][,...]`` (read once by the worker entry point):

  crash            the rank raises right after joining the control plane (the job must come down)
  hang             the rank sleeps forever (signals must still stop the job)
  engine_crash@n   rollout: the generation engine raises on its n-th decoding step (once); the
                   rank must rebuild it and the loop re-queue the episodes it held
  push_refused@n   rollout: the engine refuses its n-th weight push after reading it whole (once);
                   it must keep serving its old version and the orchestrator have the push resent
  scorer_crash@n   reward: the rubric raises on the n-th batch (once); its samples must be retried
  server_crash@n   reward_server: the judge / reward model fails on its n-th batch; the server leaves
                   service and the reward workers must re-send its requests to another replica
  env_crash@n      env: the env rank goes down on the n-th environment call it receives; the rollout
                   ranks must run the episodes it held again on the env ranks still up
  reward_drop@n    reward: from the n-th sample it scores on, every total reward is lowered by
                   REWARD_DROP (a scorer that silently broke); the reward-collapse guard must fire
  nan_loss@n       trainer: the advantages of its n-th batch (warm-start batches count) are NaN, so
                   the real loss and gradients are; the non-finite-loss guard must fire
  desync_weights@n trainer: right after its n-th weight push the trainer's weights get Gaussian
                   noise (std DESYNC_STD) the engines never receive, so the next batch's trainer and
                   engine log-probs disagree; the mismatch-spike guard must fire
  drift_weights@n  trainer: the same noise after each of its pushes n to n + DRIFT_PUSHES - 1, so the
                   mismatch stays high for a few steps and then falls back; an adaptive staleness
                   bound (schedule.adaptive_staleness) must fall to its floor, then grow again

One hook: the worker entry point reads the variable once (:meth:`RankFaults.from_env`) and hands
the rank's :class:`RankFaults` to its role, which asks it for the counter of each kind it can suffer.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

KINDS = (
    "crash",
    "hang",
    "engine_crash",
    "push_refused",
    "scorer_crash",
    "server_crash",
    "env_crash",
    "reward_drop",
    "nan_loss",
    "desync_weights",
    "drift_weights",
)
FAULT_ENV = "HETRL_INJECT_FAULT"
REWARD_DROP = 1.0  # more than any tiny recipe's reward range, so the drop shows whatever the level
DESYNC_STD = 0.05  # about the scale of the weights of a random-init tiny model: a large, certain mismatch
DRIFT_PUSHES = 3  # pushes drift_weights lasts: long enough to hold a bound at its floor, short enough to see it recover


@dataclass(frozen=True)
class Fault:
    role: str
    role_rank: int
    kind: str
    at: int = 1

    @classmethod
    def parse(cls, spec: str | None) -> list[Fault]:
        faults = []
        for part in (spec or "").split(","):
            if not part.strip():
                continue
            try:
                role, rank, rest = part.strip().split(":")
                kind, _, at = rest.partition("@")
                fault = cls(role, int(rank), kind, int(at) if at else 1)
            except ValueError:
                raise ValueError(f"{FAULT_ENV} entries must be role:rank:kind[@n], got {part!r}") from None
            if fault.kind not in KINDS:
                raise ValueError(f"{FAULT_ENV} kind must be one of {KINDS}, got {fault.kind!r}")
            faults.append(fault)
        return faults

    def applies_to(self, role: str, role_rank: int, kind: str) -> bool:
        return (self.role, self.role_rank, self.kind) == (role, role_rank, kind)


def at_start(faults: list[Fault], role: str, role_rank: int) -> None:
    """The start-up faults: crash or hang this rank."""
    if any(f.applies_to(role, role_rank, "crash") for f in faults):
        raise RuntimeError(f"injected fault: {role}[{role_rank}] crashes")
    if any(f.applies_to(role, role_rank, "hang") for f in faults):
        while True:
            time.sleep(3600)


class Countdown:
    """Fires once, on the n-th call, when the fault targets this rank and kind."""

    def __init__(self, faults: list[Fault], role: str, role_rank: int, kind: str) -> None:
        self.left = next((f.at for f in faults if f.applies_to(role, role_rank, kind)), -1)

    def fire(self) -> bool:
        if self.left < 0:
            return False
        self.left -= 1
        return self.left == 0


class Onset(Countdown):
    """Stays on from the n-th call on (a fault that persists once it started)."""

    def __init__(self, faults: list[Fault], role: str, role_rank: int, kind: str) -> None:
        super().__init__(faults, role, role_rank, kind)
        self.on = False

    def fire(self) -> bool:
        self.on = self.on or super().fire()
        return self.on


class Span(Countdown):
    """On from the n-th call for ``length`` calls (a fault that starts, lasts a while and goes away)."""

    def __init__(self, faults: list[Fault], role: str, role_rank: int, kind: str, length: int) -> None:
        super().__init__(faults, role, role_rank, kind)
        self.on, self.calls_left = False, length

    def fire(self) -> bool:
        self.on = self.on or super().fire()
        if not self.on or self.calls_left == 0:
            return False
        self.calls_left -= 1
        return True


class RankFaults:
    """The faults injected into one rank: each kind's counter, for the role that can suffer it."""

    def __init__(self, faults: list[Fault], role: str, role_rank: int) -> None:
        self.faults, self.role, self.role_rank = list(faults), role, role_rank

    @classmethod
    def from_env(cls, role: str, role_rank: int) -> RankFaults:
        """The faults :data:`FAULT_ENV` injects into ``role[role_rank]``."""
        return cls(Fault.parse(os.environ.get(FAULT_ENV)), role, role_rank)

    def at_start(self) -> None:
        """The start-up faults: crash or hang this rank."""
        at_start(self.faults, self.role, self.role_rank)

    def countdown(self, kind: str) -> Countdown:
        return Countdown(self.faults, self.role, self.role_rank, kind)

    def onset(self, kind: str) -> Onset:
        return Onset(self.faults, self.role, self.role_rank, kind)

    def span(self, kind: str, length: int) -> Span:
        return Span(self.faults, self.role, self.role_rank, kind, length)
