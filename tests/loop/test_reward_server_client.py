"""The reward_server role's wire under mpiexec: batching, re-sending on a timeout or a failed replica, the attempt
bound."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetrl.launch.local import find_mpiexec

RIG = Path(__file__).with_name("reward_server_rig.py")
pytestmark = pytest.mark.mpi


def test_requests_are_batched_rerouted_and_bounded():
    proc = subprocess.run(
        [find_mpiexec(), "-launcher", "fork", "-n", "3", sys.executable, str(RIG)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    seen = next(line for line in lines if "many" in line)
    batches = {line["rank"]: line["batches"] for line in lines if "rank" in line}
    # 16 requests asked at once: spread over both replicas, each answering its share in one batch.
    assert sorted(seen["many"]) == sorted(f"q{i}" for i in range(16)) and all(
        a.endswith(q) for q, a in seen["many"].items()
    )
    assert {a.split(":")[0] for a in seen["many"].values()} == {"0", "1"} and batches[0][0] + batches[1][0] == 16
    assert max(batches[0][0], batches[1][0]) > 1
    # A request the model cannot take comes back as its own error; its batch-mates and the replica are fine.
    assert "too long for the judge" in seen["toolong"]["toolong"] and seen["toolong"]["fine"].endswith(":fine")
    # Rank 0 sits on "slow" past reward.server.request_timeout_s: the request is re-sent and rank 1 answers.
    assert seen["slow"] == {"slow": "1:slow"}
    # Stuck on both replicas: after reward.server.max_attempts (2) timeouts the request fails, named.
    assert "unanswered after 2 x reward.server.request_timeout_s" in seen["stuck"]["stuck"]
    # Rank 0's judge dies on "crash": it leaves service and everything it held is answered by rank 1.
    assert seen["crash"] == {"crash": "1:crash", "after": "1:after"}
    assert seen["resent"] >= 3 and "leaving service" in proc.stderr
