"""Shared by the tests that submit to the real local cluster (slurm/local/cluster.sh)."""

from __future__ import annotations

import shutil
import subprocess

import pytest


def cluster_down_reason() -> str:
    """Why the local cluster cannot take jobs now ("" when its gpu and cpu nodes are up)."""
    if shutil.which("sinfo") is None:
        return "sinfo not found"
    done = subprocess.run(["sinfo", "-h", "-p", "gpu,cpu", "-o", "%T"], capture_output=True, text=True)
    states = set(done.stdout.split())
    if done.returncode or not states or not states <= {"idle", "mixed", "allocated", "planned", "completing"}:
        return f"nodes not up ({done.stderr.strip() or sorted(states)})"
    accounting = subprocess.run(["sacct", "-n", "-X", "-j", "1"], capture_output=True, text=True)
    if accounting.returncode:  # job states after a job ends come only from slurmdbd (and its MariaDB)
        last_line = accounting.stderr.strip().splitlines()[-1] if accounting.stderr.strip() else accounting.returncode
        return f"accounting down (sacct: {last_line})"
    return ""


_DOWN = cluster_down_reason()
# Module marks: `pytestmark = NEEDS_LOCAL_CLUSTER` in a test module that submits jobs.
NEEDS_LOCAL_CLUSTER = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        bool(_DOWN),
        reason=f"local Slurm cluster not running: {_DOWN}; start it with `sudo slurm/local/cluster.sh start`",
    ),
]
