"""Run under ``mpiexec -n 3``: two servers (world ranks 0, 1) of a toy service and one client (rank 2).

A server answers a request ``"<rank>:<method>"``, except: ``hold`` (never answered, on both),
``hold<rank>`` (never answered there), ``bad`` (answered with an error) and ``down<rank>`` (the server
goes down). The client runs the phases below one after the other and prints one JSON line of what it
saw; each server prints the sizes of the Requests it got, after every client left.
"""

import json
import sys
import time
from concurrent.futures import Future
from types import SimpleNamespace

from mpi4py import MPI

from hetrl.control.comm import RoleContext, flush_sends
from hetrl.control.plan import RankAssignment
from hetrl.control.protocol import Requests
from hetrl.control.role_loop import RoleLoop
from hetrl.control.service import Client, Service, ServiceDown

TIMEOUT_S = 0.5
ROLES = {"server": [0, 1], "client": [2]}


class Lost(RuntimeError):
    """The rig client's error for a request no server will answer (a role's own, as EnvServerLost is)."""


class RigClient(Client):
    def lost(self, reason: str) -> Exception:
        return Lost(reason)


def report(obj) -> None:
    """One JSON line in ONE write: print() writes the text and its newline apart when stdout is unbuffered, and
    mpiexec then interleaves another rank's line between them (seen in CI: two reports on one line)."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def context(world) -> RoleContext:
    rank = world.Get_rank()
    role = "server" if rank < 2 else "client"
    plan = SimpleNamespace(ranks_of=lambda name: ROLES.get(name, []))  # all a service asks of a plan
    return RoleContext(world, None, plan, RankAssignment(rank, role, ROLES[role].index(rank), "local", 0))


def serve(ctx) -> None:
    rank = ctx.world.Get_rank()
    service = Service(ctx, "client")
    batches = []

    def take(message: Requests, source: int) -> None:
        batches.append(len(message.calls))
        service.handlers[Requests](message, source)

    loop = RoleLoop(ctx, {**service.handlers, Requests: take})

    def work() -> bool:
        calls = service.receive()
        for call in calls:
            if call.method == f"down{rank}":
                service.go_down("told to go down")
                break
            if call.method in ("hold", f"hold{rank}"):
                continue
            ok = call.method != "bad"
            service.reply(call.client, call.request_id, ok, f"{rank}:{call.method}" if ok else "no such thing")
        loop.stop = not service.clients_left
        return service.flush() or bool(calls)

    service.ready()
    loop.run(work)
    report({"rank": rank, "batches": batches})


def outcome(future: Future) -> list[str]:
    error = future.exception()
    return ["ok", future.result()] if error is None else [type(error).__name__, str(error)]


def settle(client: Client, futures: list[Future]) -> list[list[str]]:
    deadline = time.monotonic() + 30
    while not all(f.done() for f in futures) and time.monotonic() < deadline:
        client.pump()
        time.sleep(0.001)
    return [outcome(f) for f in futures]


def drive(ctx) -> dict:
    client = RigClient(
        ctx,
        "server",
        timeout_s=TIMEOUT_S,
        max_attempts=2,
        timeout_key="service.timeout_s",
        attempts_key="service.max_attempts",
        replicas_key="service.replicas",
    )
    seen = {}
    deadline = time.monotonic() + 30
    while client.ready != {0, 1} and time.monotonic() < deadline:  # both said Ready: requests spread over both
        client.pump()
        time.sleep(0.001)
    # batching and spreading: six at once go out in one pump, three to each server
    seen["spread"] = settle(client, [client.request(f"q{i}", None) for i in range(6)])
    seen["bad"] = settle(client, [client.request("bad", None)])
    # equal loads: rank 0 first (the client's role rank rotates ties); it sits on hold0, so rank 1 answers
    seen["retry"] = settle(client, [client.request("hold0", None)])
    # held by both: tried on each, failed after max_attempts (2)
    seen["attempts"] = settle(client, [client.request("hold", None)])
    # rank 0 now holds 5, rank 1 one (the replies say so): the next four unpinned go to rank 1
    pinned = [client.request("hold", None, server=0) for _ in range(3)]
    seen["loads"] = settle(client, [client.request("echo", None, server=s) for s in (0, 1)])
    seen["reported"] = dict(client.reported)
    seen["least_loaded"] = settle(client, [client.request("e", None) for _ in range(4)])
    seen["pinned_overdue"] = settle(client, pinned)
    # rank 1 goes down on down1: that request is answered by rank 0, the one pinned to rank 1 fails
    seen["down"] = settle(client, [client.request("down1", None), client.request("echo", None, server=1)])
    seen["after_down"] = settle(client, [client.request("echo", None, server=1)])
    seen["resent"] = client.num_resent
    # rank 0 goes down too: everything fails, naming both
    seen["all_down"] = settle(client, [client.request("down0", None), client.request("later", None)])
    try:
        client.pick()
    except ServiceDown as error:
        seen["pick"] = str(error)
    client.close()
    return seen


def main() -> int:
    world = MPI.COMM_WORLD
    ctx = context(world)
    if world.Get_rank() < 2:
        serve(ctx)
    else:
        report(drive(ctx))
    flush_sends()
    return 0


if __name__ == "__main__":
    sys.exit(main())
