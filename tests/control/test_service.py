"""The service layer under mpiexec (tests/control/service_rig.py): routing, batching, deadlines, Ready/Down."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetrl.launch.local import find_mpiexec

RIG = Path(__file__).with_name("service_rig.py")
pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def run():
    proc = subprocess.run(
        [find_mpiexec(), "-launcher", "fork", "-n", "3", sys.executable, str(RIG)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]  # the servers exit on ClientDone
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    seen = next(line for line in lines if "spread" in line)
    return seen, {line["rank"]: line["batches"] for line in lines if "rank" in line}


def test_what_is_queued_between_pumps_goes_out_in_one_message_per_server_spread_evenly(run):
    seen, batches = run
    assert sorted(seen["spread"]) == sorted([["ok", f"{r}:q{i}"] for i, r in enumerate([0, 1] * 3)])
    assert batches[0][0] == 3 and batches[1][0] == 3
    assert seen["bad"] == [["RuntimeError", "the server rank could not take the bad request: no such thing"]]


def test_least_loaded_routing_counts_the_reported_load_and_what_was_routed_since(run):
    seen, _ = run
    assert seen["reported"] == {"0": 5, "1": 1}  # rank 0 holds five requests, rank 1 one
    assert seen["least_loaded"] == [["ok", "1:e"]] * 4


def test_an_overdue_request_goes_to_another_replica_and_fails_after_max_attempts(run):
    seen, _ = run
    assert seen["retry"] == [["ok", "1:hold0"]]
    assert seen["attempts"] == [
        [
            "Lost",
            "hold request unanswered after 2 x service.timeout_s=0.5 s on server rank(s) [1, 0] "
            "(service.max_attempts=2)",
        ]
    ]
    assert (
        seen["pinned_overdue"]
        == [["Lost", "hold request unanswered after 1 x service.timeout_s=0.5 s on server rank(s) [0]"]] * 3
    )


def test_a_down_server_fails_what_is_pinned_to_it_and_its_other_requests_go_elsewhere(run):
    seen, _ = run
    down = ["Lost", "server rank 1 is down: told to go down"]
    assert seen["down"] == [["ok", "0:down1"], down]
    assert seen["after_down"] == [down]
    assert seen["resent"] == 3  # hold0 once, hold once, down1 once


def test_with_every_server_down_everything_fails_naming_each(run):
    seen, _ = run
    error = (
        "all 2 server rank(s) are down: rank 0: told to go down; rank 1: told to go down "
        "(see logs/server_*.log; service.replicas adds ranks)"
    )
    assert seen["all_down"] == [["ServiceDown", error]] * 2
    assert seen["pick"] == error
