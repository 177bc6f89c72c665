"""Fault injection for tests of the launcher and the loop's fault tolerance.

``HETRL_INJECT_FAULT=<role>:<role_rank>:<kind>[@<n>][,...]`` (read once by the worker entry point):

  crash            the rank raises right after joining the control plane (the job must come down)
  hang             the rank sleeps forever (signals must still stop the job)
  engine_crash@n   rollout: the generation engine raises on its n-th decoding step (once); the
                   rank must rebuild it and the loop re-queue the episodes it held
  scorer_crash@n   reward: the rubric raises on the n-th batch (once); its samples must be retried
"""

from __future__ import annotations

import time
from dataclasses import dataclass

KINDS = ("crash", "hang", "engine_crash", "scorer_crash")


@dataclass(frozen=True)
class Fault:
    role: str
    role_rank: int
    kind: str
    at: int = 1

    @classmethod
    def parse(cls, spec: str | None) -> list["Fault"]:
        faults = []
        for part in (spec or "").split(","):
            if not part.strip():
                continue
            try:
                role, rank, rest = part.strip().split(":")
                kind, _, at = rest.partition("@")
                fault = cls(role, int(rank), kind, int(at) if at else 1)
            except ValueError:
                raise ValueError(f"HETRL_INJECT_FAULT entries must be role:rank:kind[@n], got {part!r}") from None
            if fault.kind not in KINDS:
                raise ValueError(f"HETRL_INJECT_FAULT kind must be one of {KINDS}, got {fault.kind!r}")
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
