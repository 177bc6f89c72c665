"""The mpi4py control plane: one MPI world across every role, split into role communicators.

Control messages (work items, results, batches of samples) travel here as pickled objects; weights
go over torch.distributed. No call here blocks inside MPI, for two reasons:

* MPICH's blocking receive spins a core at 100%, which on a 2-core machine starves the trainer.
  We probe, and sleep with a short back-off while nothing has arrived.
* Some messages complete only while their *sender* makes MPI progress (seen with MPICH 5.0 over
  shared memory for 7.8-8.17 KB messages; any MPI may do it for large ones). A blocking receive
  of one waits on whatever its sender does next: a trainer that sent its 8 KB step result and then
  entered a weight push (a gloo collective) left the orchestrator blocked in ``MPI_Mrecv``, unable
  to tell the engines to join that push: a deadlock (issue 14). Matched messages are therefore received
  with non-blocking requests that later polls complete, and a rank about to enter a collective
  first completes its own sends (:func:`flush_sends`).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hetrl.control import timeline
from hetrl.control.plan import ROLES, Plan, RankAssignment

# A wait probes with naps that double from _POLL_MIN_S to _POLL_SOON_S while the message is likely
# to be on its way (the first _SOON_S: a step's results, a reward round trip), then up to _POLL_MAX_S.
# A message thus waits at most ~2 ms to be seen on the critical path, and an idle rank wakes 50 times a second.
_POLL_MIN_S = 0.0005
_POLL_SOON_S = 0.002
_SOON_S = 1.0
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
    SHARD = 13  # a trainer replica's samples (protocol.TrainShard), received only while a step waits for them


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


def envelope(obj: Any) -> tuple[float, Any]:
    """What goes on the wire: ``obj`` with its send time, for the receiver's timeline (hetrl.control.timeline)."""
    return time.time(), obj


def send(comm: Any, obj: Any, dest: int, tag: Tag) -> None:
    """Send without waiting for the receiver; the message completes in later polls or flush_sends()."""
    _outbox.append(comm.isend(envelope(obj), dest=dest, tag=int(tag)))
    _progress_sends()


def _progress_sends() -> None:
    if _outbox:
        _outbox[:] = [request for request in _outbox if not request.Test()]


def naps() -> Iterator[float]:
    """The sleeps between the probes of one wait (see _POLL_SOON_S); a role's own poll loop starts a new
    wait (a fresh ``naps()``) whenever something moved, so that the next message is seen within ~2 ms.

    A message matched since the last nap starts them over too: a large one (a step's batch to the
    trainer) is still arriving, completes within a poll or two of its sender's, and would otherwise
    wait out another of an idle rank's 20 ms naps.
    """
    start, delay, matched = time.monotonic(), _POLL_MIN_S, _matched
    while True:
        if _matched != matched:
            start, delay, matched = time.monotonic(), _POLL_MIN_S, _matched
        yield delay
        delay = min(delay * 2, _POLL_SOON_S if time.monotonic() - start < _SOON_S else _POLL_MAX_S)


def flush_sends(timeout_s: float = 300.0) -> None:
    """Wait (sleeping) until every message this process sent was received.

    Call it before exiting, and before entering a collective or any wait that makes no MPI
    progress: a large message still in flight would hold its receiver until that wait ends.
    """
    deadline = time.monotonic() + timeout_s
    pauses = naps()
    while _outbox:
        _progress_sends()
        if time.monotonic() > deadline:
            raise PeerTimeout(f"{len(_outbox)} sent message(s) not received within {timeout_s:.0f} s")
        time.sleep(next(pauses))


@dataclass
class _Incoming:
    """A matched message being received (a large one completes as its sender makes progress)."""

    comm: Any
    request: Any
    source: int
    tag: int


# Receives in flight, oldest first. From one sender, messages of one tag are delivered in the order
# sent: a later one is never returned while an earlier one is still arriving.
_inbox: list[_Incoming] = []
_matched = 0  # messages matched so far (see naps)


def poll(comm: Any, source: int | None = None, tag: Tag | None = None) -> tuple[Any, int, int] | None:
    """Return ``(obj, source, tag)`` if a matching message has arrived whole, else None. Never blocks."""
    global _matched
    from mpi4py import MPI

    _progress_sends()
    status = MPI.Status()
    # MPICH's probes look at what has arrived before they make progress, so a probe finds only what an
    # earlier MPI call brought in: without this first one, every message waited one more nap (an idle
    # rank saw it ~36 ms after it was sent instead of ~15).
    comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
    # Everything that arrived, whoever sent it: a sender waiting for its message to complete
    # must not depend on what this rank happens to be waiting for.
    while (message := comm.improbe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)) is not None:
        _inbox.append(_Incoming(comm, message.irecv(), status.Get_source(), status.Get_tag()))
        _matched += 1
    still_arriving: set[tuple[int, int]] = set()
    for item in _inbox:
        if (
            item.comm != comm
            or (source is not None and item.source != source)
            or (tag is not None and item.tag != int(tag))
        ):
            continue
        if (item.source, item.tag) in still_arriving:
            continue
        done, wrapped = item.request.test()
        if done:
            _inbox.remove(item)
            sent, obj = wrapped
            timeline.hop(type(obj).__name__, item.source, sent)
            return obj, item.source, item.tag
        still_arriving.add((item.source, item.tag))
    return None


def recv(
    comm: Any, source: int | None = None, tag: Tag | None = None, timeout_s: float | None = None
) -> tuple[Any, int, int]:
    """Wait for a matching message, sleeping between probes so an idle rank uses no CPU."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pauses = naps()
    while True:
        got = poll(comm, source, tag)
        if got is not None:
            return got
        if deadline is not None and time.monotonic() > deadline:
            who = "any rank" if source is None else f"rank {source}"
            what = "any message" if tag is None else Tag(tag).name
            raise PeerTimeout(f"waited {timeout_s:.0f} s for {what} from {who}")
        time.sleep(next(pauses))


def share(comm: Any, obj: Any = None, root: int = 0) -> Any:
    """``obj`` of ``root`` on every rank of ``comm``: a tree broadcast (MPI ``Ibcast``) polled from Python.

    How the trainer's leader hands each message to the other trainer ranks: the orchestrator's cost
    does not grow with them, and a rank waiting here for the next step still runs Python between
    polls (its pre-emption signal handler, say) and uses no CPU.
    """
    import pickle

    import numpy as np

    is_root = comm.Get_rank() == root
    payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8) if is_root else None
    size = np.array([0 if payload is None else payload.size], dtype=np.int64)
    _wait(comm.Ibcast(size, root=root))
    if not is_root:
        payload = np.empty(int(size[0]), dtype=np.uint8)
    _wait(comm.Ibcast(payload, root=root))
    return obj if is_root else pickle.loads(payload.tobytes())


def _wait(request: Any) -> None:
    """Complete a non-blocking MPI request, sleeping between tests (and making this rank's sends progress)."""
    pauses = naps()
    while not request.Test():
        _progress_sends()
        time.sleep(next(pauses))
