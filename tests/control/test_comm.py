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
    proc = subprocess.run([find_mpiexec(), "-launcher", "fork", "-n", "2", sys.executable, str(RIG), str(tmp_path / "go"), str(payload)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and f"OK {payload}" in proc.stdout, proc.stdout + proc.stderr
