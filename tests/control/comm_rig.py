"""Run under ``mpiexec -n 2``: the deadlock of issue 14 in miniature.

Rank 0 plays the trainer: it sends its step's result, then waits on something only rank 1 can
provide, outside MPI (the weight push: a gloo collective the engines join when the orchestrator
tells them to). Rank 1 plays the orchestrator: busy elsewhere when the result is sent, it then
polls for it and, meanwhile, must keep doing its other work (tell the engines to join): write GO.

Seen here with MPICH 5.0 (ch4, shared memory): messages of 7.8 to 8.17 KB (the step result that
hung was 8148 bytes) complete only while their sender makes MPI progress. A receive that blocks
inside MPI then sits in ``MPI_Mrecv`` until rank 0's bound runs out. Prints ``OK <bytes>`` on
rank 1 when the exchange completed in time.
"""

import sys
import time
from pathlib import Path

from mpi4py import MPI

from hetrl.control.comm import Tag, flush_sends, poll, send

BOUND_S = 20.0


def main(go: Path, payload: int) -> int:
    world = MPI.COMM_WORLD
    if world.Get_rank() == 0:
        send(world, b"x" * payload, 1, Tag.RESULT)
        deadline = time.monotonic() + BOUND_S
        while not go.exists():  # a wait that makes no MPI progress
            if time.monotonic() > deadline:
                print("TIMEOUT rank 1 never got to its other work", flush=True)
                flush_sends()
                return 1
            time.sleep(0.05)
        flush_sends()
        return 0
    time.sleep(1.0)  # busy elsewhere when the result is sent: it has not arrived whole when first probed
    started, got = time.monotonic(), None
    while got is None or not go.exists():
        got = got or poll(world, tag=Tag.RESULT)
        if time.monotonic() - started > 0.5:
            go.touch()  # the orchestrator's other duty, due while it waits for the result
        time.sleep(0.01)
    print(f"OK {len(got[0])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2])))
