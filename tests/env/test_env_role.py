"""The env role over the MPI control plane: same episodes as inline envs, lost ranks re-run elsewhere."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetrl.launch.local import find_mpiexec

RIG = Path(__file__).with_name("env_role_rig.py")
pytestmark = pytest.mark.mpi


def rig(tmp_path, mode, fault=""):
    out = tmp_path / f"{mode}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HETRL_INJECT_FAULT": fault}
    proc = subprocess.run(
        [find_mpiexec(), "-launcher", "fork", "-n", "3", sys.executable, str(RIG), mode, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_role_episodes_equal_inline_ones_and_spread_over_ranks(tmp_path):
    report = rig(tmp_path, "compare")
    assert report["equal"]
    assert report["turns"] == [3] * 6
    assert set(report["reported_load"]) == {"1", "2"}  # both env ranks answered: episodes were spread


def test_episodes_of_a_lost_env_rank_run_again_on_the_other(tmp_path):
    report = rig(tmp_path, "rerun", fault="env:0:env_crash@5")  # env role rank 0 (world rank 1) dies on its 5th call
    assert sorted(report["done"]) == sorted(f"s{i}" for i in range(8))
    assert report["lost"] > 0 and report["live"] == [2]
    assert report["placed_on"].count(2) >= report["lost"]


def test_no_env_rank_left_is_a_clear_error(tmp_path):
    report = rig(tmp_path, "none", fault="env:0:env_crash@2,env:1:env_crash@2")
    assert report["done"] == [] and report["live"] == []
    assert "all 2 env rank(s) are down" in report["errors"][0] and "injected fault" in report["errors"][0]
