"""Stands in for ``python -m hetrl.launch.worker --run-dir RUN_DIR`` in the Slurm tests.

Invoked as ``python slurm_fake_worker.py -m hetrl.launch.worker --run-dir RUN_DIR`` (the rendered
script's words after the interpreter); ``FAKE_WORKER_MODE`` (exported through sbatch) picks:
  probe   - join the MPI world (pmi2) and print one JSON line: rank, size, node, GPUs seen;
  sleep   - record the pid under RUN_DIR/pids/ and sleep (for cancel tests);
  requeue - behave like the loop: wait for SIGUSR1, checkpoint, exit 3 (requeue me); when a
            checkpoint exists, resume from it and finish.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

REQUEUE_EXIT_CODE = 3


def main() -> int:
    if sys.argv[1:4] != ["-m", "hetrl.launch.worker", "--run-dir"]:
        print(f"unexpected arguments: {sys.argv[1:]}", flush=True)
        return 9
    run_dir = Path(sys.argv[4])
    rank = int(os.environ["SLURM_PROCID"])
    mode = os.environ.get("FAKE_WORKER_MODE", "probe")
    if mode == "probe":
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        record = {
            "rank": world.Get_rank(),
            "size": world.Get_size(),
            "node": os.environ.get("SLURMD_NODENAME"),
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "run_dir": str(run_dir),
        }
        print("FAKE " + json.dumps(record), flush=True)
        world.Barrier()
        return 0
    if mode == "sleep":
        pids = run_dir / "pids"
        pids.mkdir(exist_ok=True)
        (pids / str(rank)).write_text(str(os.getpid()))
        time.sleep(120)
        return 0
    checkpoint = run_dir / f"checkpoint-{rank}"
    if checkpoint.exists():
        print(f"rank {rank}: resumed from checkpoint {checkpoint.read_text()}", flush=True)
        return 0

    def checkpoint_and_exit(signum: int, _frame: object) -> None:
        checkpoint.write_text(f"step-7 (signal {signum})")
        print(f"rank {rank}: checkpointed on signal {signum}", flush=True)
        sys.exit(REQUEUE_EXIT_CODE)

    signal.signal(signal.SIGUSR1, checkpoint_and_exit)
    signal.signal(signal.SIGTERM, checkpoint_and_exit)
    (run_dir / f"ready-{rank}").write_text("")
    time.sleep(120)
    return 1


if __name__ == "__main__":
    sys.exit(main())
