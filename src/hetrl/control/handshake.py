"""Start-up handshake: every rank proves it runs the same plan before any work is exchanged.

Each non-orchestrator rank sends HELLO with its plan slice (role, role rank, GPUs) and a digest of
the plan it loaded; the orchestrator checks that every rank of the plan answered with the same
digest, sends START, takes ``beats`` heartbeats from everyone, and writes ``handshake.json`` into
the run directory. A rank that does not answer within ``timeout_s`` fails the job with its name.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from dataclasses import asdict
from pathlib import Path

from hetrl.control import rundir
from hetrl.control.comm import RoleContext, Tag, recv, send
from hetrl.control.protocol import HandshakeDone, Heartbeat, Hello, Start


def plan_digest(ctx: RoleContext) -> str:
    return hashlib.sha256(ctx.plan.to_json().encode()).hexdigest()[:16]


def run_handshake(
    ctx: RoleContext, run_dir: Path, beats: int = 2, interval_s: float = 0.05, timeout_s: float = 120.0
) -> dict | None:
    """Run the handshake on every rank; the orchestrator returns the record it wrote, others None."""
    if ctx.role == "orchestrator":
        return _orchestrate(ctx, Path(run_dir), beats, timeout_s)
    _participate(ctx, beats, interval_s, timeout_s)
    return None


def _participate(ctx: RoleContext, beats: int, interval_s: float, timeout_s: float) -> None:
    hello = Hello(ctx.assignment, plan_digest(ctx), os.getpid(), socket.gethostname(), ctx.role_comm.Get_size())
    send(ctx.world, hello, ctx.orchestrator_rank, Tag.HELLO)
    recv(ctx.world, ctx.orchestrator_rank, Tag.START, timeout_s)
    for beat in range(beats):
        send(ctx.world, Heartbeat(ctx.rank, beat, time.time()), ctx.orchestrator_rank, Tag.HEARTBEAT)
        time.sleep(interval_s)
    recv(ctx.world, ctx.orchestrator_rank, Tag.SHUTDOWN, timeout_s)


def _orchestrate(ctx: RoleContext, run_dir: Path, beats: int, timeout_s: float) -> dict:
    others = [a.world_rank for a in ctx.plan.assignments if a.world_rank != ctx.rank]
    digest = plan_digest(ctx)
    hellos: dict[int, Hello] = {}
    deadline = time.monotonic() + timeout_s
    while len(hellos) < len(others):
        remaining = deadline - time.monotonic()
        try:
            obj, source, _ = recv(ctx.world, tag=Tag.HELLO, timeout_s=max(remaining, 0.0))
        except TimeoutError:
            missing = sorted(set(others) - set(hellos))
            raise TimeoutError(f"handshake: no HELLO within {timeout_s:.0f} s from ranks {missing}") from None
        if obj.digest != digest:
            raise RuntimeError(
                f"handshake: rank {source} ({obj.assignment.role}) loaded a different plan "
                f"(digest {obj.digest} != {digest})"
            )
        hellos[source] = obj
    for rank in others:
        send(ctx.world, Start(), rank, Tag.START)
    heartbeats = {rank: 0 for rank in others}
    for _ in range(beats * len(others)):
        obj, source, _ = recv(ctx.world, tag=Tag.HEARTBEAT, timeout_s=timeout_s)
        heartbeats[source] += 1
    for rank in others:
        send(ctx.world, HandshakeDone(), rank, Tag.SHUTDOWN)
    record = {
        "digest": digest,
        "world_size": ctx.plan.world_size,
        "ranks": [_record(hellos[r]) for r in sorted(hellos)],
        "heartbeats": heartbeats,
        "orchestrator": {"rank": ctx.rank, "pid": os.getpid(), "host": socket.gethostname()},
    }
    (run_dir / rundir.HANDSHAKE).write_text(json.dumps(record, indent=1))
    return record


def _record(hello: Hello) -> dict:
    """A rank's line of ``handshake.json``: its assignment's fields beside the rest of its hello."""
    fields = asdict(hello)
    return {**fields.pop("assignment"), **fields}
