"""The control plane's receives never block inside MPI (the disaggregated-sync deadlock of issue 14)."""

import subprocess
import sys
from pathlib import Path

import pytest

from hetrl.launch.local import find_mpiexec

RIG = Path(__file__).with_name("comm_rig.py")
pytestmark = pytest.mark.mpi


# 8133 bytes pickle to the 8148-byte step result that hung (MPICH 5.0, ch4 shared memory: messages
# just under 8 KB, 7.8-8.17 KB here, wait on their sender's progress); 1 MB takes another protocol.
@pytest.mark.parametrize("payload", [8133, 1024 * 1024])
def test_a_message_does_not_hold_its_receiver_while_the_sender_waits_elsewhere(tmp_path, payload):
    proc = subprocess.run(
        [find_mpiexec(), "-launcher", "fork", "-n", "2", sys.executable, str(RIG), str(tmp_path / "go"), str(payload)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and f"OK {payload}" in proc.stdout, proc.stdout + proc.stderr


SHARE = """
import pathlib, signal, sys, time
from mpi4py import MPI
from hetrl.control.comm import share
world = MPI.COMM_WORLD
start, handled = time.monotonic(), []
signal.signal(signal.SIGALRM, lambda *_: handled.append(time.monotonic() - start))
signal.setitimer(signal.ITIMER_REAL, 0.3)  # a signal (a pre-emption, say) arrives while the rank waits
if world.Get_rank() == 0:
    time.sleep(1.5)  # the others wait for the step meanwhile
    objects = [share(world, {"step": 7, "tokens": list(range(n))}) for n in (3, 300_000)]
else:
    objects = [share(world) for _ in range(2)]
line = f"OK {world.Get_rank()} {[len(o['tokens']) for o in objects]} {objects[0]['step']} {handled[0] < 1.0}"
# a file each: mpiexec may interleave stdout mid-line
pathlib.Path(sys.argv[1], f"rank{world.Get_rank()}").write_text(line)
"""


def test_share_hands_the_leaders_object_to_every_rank(tmp_path):
    """The trainer leader's broadcast (small and large messages) reaches every rank whole, and a rank
    waiting in it still handles its signals then, not once the message came."""
    proc = subprocess.run(
        [find_mpiexec(), "-launcher", "fork", "-n", "3", sys.executable, "-c", SHARE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [(tmp_path / f"rank{rank}").read_text() for rank in range(3)] == [
        f"OK {rank} [3, 300000] 7 True" for rank in range(3)
    ], proc.stdout


FIRST_POLL = """
import sys, time
from mpi4py import MPI
from hetrl.control.comm import Tag, flush_sends, poll, send
world = MPI.COMM_WORLD
if world.Get_rank() == 0:
    send(world, "step", 1, Tag.WORK)
    flush_sends(timeout_s=60)
else:
    time.sleep(0.5)  # the message has long arrived: no MPI call of this rank has brought it in yet
    got = poll(world, 0, Tag.WORK)
    print("FIRST POLL", None if got is None else got[0])
    while got is None:
        got = poll(world, 0, Tag.WORK)
"""


def test_the_first_poll_after_a_message_arrived_returns_it():
    """MPICH's probe looks at what has arrived before it makes progress; a poll that only probed found a
    message one poll (one nap) late."""
    proc = subprocess.run(
        [find_mpiexec(), "-launcher", "fork", "-n", "2", sys.executable, "-c", FIRST_POLL],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FIRST POLL step" in proc.stdout, proc.stdout


def test_naps_stay_short_while_a_message_is_likely_on_its_way(monkeypatch):
    """~2 ms between probes for the first second of a wait (a step's results, a reward round trip), then up to 20 ms."""
    from hetrl.control import comm

    clock = [100.0]
    monkeypatch.setattr(comm.time, "monotonic", lambda: clock[0])
    pauses = comm.naps()
    soon = [next(pauses) for _ in range(10)]
    assert soon[:3] == [0.0005, 0.001, 0.002] and max(soon) == 0.002
    clock[0] += 1.5
    later = [next(pauses) for _ in range(6)]
    assert later == [0.004, 0.008, 0.016, 0.02, 0.02, 0.02]


def test_naps_start_over_when_a_message_is_matched(monkeypatch):
    """An idle rank's 20 ms naps start over at 0.5 ms once a probe matched a message: a large one is
    still arriving, and completes within a poll or two of its sender's."""
    from mpi4py import MPI

    from hetrl.control import comm

    clock = [100.0]
    monkeypatch.setattr(comm.time, "monotonic", lambda: clock[0])
    pauses = comm.naps()
    next(pauses)
    clock[0] += 1.5
    assert [next(pauses) for _ in range(6)][-1] == 0.02
    comm.send(MPI.COMM_SELF, "batch", dest=0, tag=comm.Tag.WORK)
    assert comm.poll(MPI.COMM_SELF, 0, comm.Tag.WORK)[0] == "batch"
    comm.flush_sends()
    assert [next(pauses) for _ in range(3)] == [0.0005, 0.001, 0.002]
