"""The mpi4py control plane: one MPI world across every role, split into role communicators.

Small control messages (work items, results, heartbeats) travel here as pickled objects; bulk
tensors (weights, batches) go over torch.distributed. Receives never block inside MPI: MPICH's
blocking receive spins a core at 100%, which on a 2-core machine starves the trainer. We probe,
and sleep with a short back-off while nothing has arrived.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Any

from hetrl.launch.plan import ROLES, Plan, RankAssignment

_POLL_MIN_S = 0.0005
_POLL_MAX_S = 0.02


class Tag(enum.IntEnum):
    """Message kinds; the tag lets a receiver wait for one kind while others queue up."""

    HELLO = 1
    START = 2
    HEARTBEAT = 3
    SHUTDOWN = 4
    WORK = 10
    RESULT = 11
    CONTROL = 12


class PeerTimeout(TimeoutError):
    """No message arrived within the deadline; says from whom it was expected."""


@dataclass
class RoleContext:
    """What one process knows about its place in the job; passed explicitly, never global."""

    world: Any  # mpi4py.MPI.Comm spanning every role
    role_comm: Any  # ranks of this role only
    plan: Plan
    assignment: RankAssignment

    @property
    def rank(self) -> int:
        return self.assignment.world_rank

    @property
    def role(self) -> str:
        return self.assignment.role

    @property
    def orchestrator_rank(self) -> int:
        return self.plan.ranks_of("orchestrator")[0]


def init_control_plane(plan: Plan, world: Any = None) -> RoleContext:
    """Split the MPI world into role communicators; the world's size must match the plan."""
    if world is None:
        from mpi4py import MPI

        world = MPI.COMM_WORLD
    if world.Get_size() != plan.world_size:
        raise RuntimeError(
            f"the MPI world has {world.Get_size()} ranks but the plan needs {plan.world_size} "
            f"({plan.role_sizes()}); launch with the command the plan renders"
        )
    assignment = plan.assignments[world.Get_rank()]
    role_comm = world.Split(color=ROLES.index(assignment.role), key=world.Get_rank())
    return RoleContext(world, role_comm, plan, assignment)


# Sends in flight. A large pickled message completes only once the receiver has posted its
# receive (MPICH's rendezvous protocol): waiting for it inside send() deadlocks two ranks that
# send to each other at the same moment. Each process keeps its outgoing requests here and
# completes them whenever it polls.
_outbox: list[Any] = []


def send(comm: Any, obj: Any, dest: int, tag: Tag) -> None:
    """Send without waiting for the receiver; the message completes in later polls or flush_sends()."""
    _outbox.append(comm.isend(obj, dest=dest, tag=int(tag)))
    _progress_sends()


def _progress_sends() -> None:
    if _outbox:
        _outbox[:] = [request for request in _outbox if not request.Test()]


def flush_sends(timeout_s: float = 300.0) -> None:
    """Wait (sleeping) until every message this process sent was received; call before exiting."""
    deadline = time.monotonic() + timeout_s
    delay = _POLL_MIN_S
    while _outbox:
        _progress_sends()
        if time.monotonic() > deadline:
            raise PeerTimeout(f"{len(_outbox)} sent message(s) not received within {timeout_s:.0f} s")
        time.sleep(delay)
        delay = min(delay * 2, _POLL_MAX_S)


def poll(comm: Any, source: int | None = None, tag: Tag | None = None) -> tuple[Any, int, int] | None:
    """Return ``(obj, source, tag)`` if a matching message is waiting, else None. Never blocks."""
    from mpi4py import MPI

    _progress_sends()
    status = MPI.Status()
    src = MPI.ANY_SOURCE if source is None else source
    tg = MPI.ANY_TAG if tag is None else int(tag)
    if not comm.Iprobe(source=src, tag=tg, status=status):
        return None
    obj = comm.recv(source=status.Get_source(), tag=status.Get_tag())
    return obj, status.Get_source(), status.Get_tag()


def recv(comm: Any, source: int | None = None, tag: Tag | None = None, timeout_s: float | None = None) -> tuple[Any, int, int]:
    """Wait for a matching message, sleeping between probes so an idle rank uses no CPU."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    delay = _POLL_MIN_S
    while True:
        got = poll(comm, source, tag)
        if got is not None:
            return got
        if deadline is not None and time.monotonic() > deadline:
            who = "any rank" if source is None else f"rank {source}"
            what = "any message" if tag is None else Tag(tag).name
            raise PeerTimeout(f"waited {timeout_s:.0f} s for {what} from {who}")
        time.sleep(delay)
        delay = min(delay * 2, _POLL_MAX_S)
