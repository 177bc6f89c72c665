"""A CPU trainer or engine rank keeps the memory it frees: a training step's activations do not
page-fault in again. The other CPU ranks do not: they would stay at their peak size."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hetrl.control.plan import RankAssignment
from hetrl.launch.worker import _keeps_freed_memory

# Twelve "steps", each allocating blocks of 48, 12, 36, 4 and 24 MB (activations of mixed sizes, the
# largest over glibc's mmap threshold) and freeing them together; prints each step's minor page faults.
_PROBE = """
import json, resource, sys
import torch
if sys.argv[1] == "keep":
    from hetrl.launch.worker import _keep_freed_memory
    _keep_freed_memory()
faults = []
for _ in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [torch.ones(n << 20) for n in (12, 3, 9, 1, 6)]
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del blocks
print(json.dumps(faults))
"""


def _faults_by_step(mode: str) -> list[int]:
    done = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True, timeout=120)
    return json.loads(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_steps_freed_blocks_are_reused_without_page_faults() -> None:
    default, kept = _faults_by_step("default"), _faults_by_step("keep")
    # glibc's dynamic mmap threshold makes its own reuse vary from step to step (some steps fault
    # nothing, others a whole step's blocks), so the last six steps are compared as a whole
    assert sum(default[-6:]) > (124 << 20) // 4096  # glibc unmapped large blocks: over a step's worth faults in again
    assert sum(kept[-6:]) < sum(default[-6:]) // 10  # the heap settles (in 4-7 steps), then is reused


@pytest.mark.parametrize(
    "role, gpus, keeps",
    [
        ("trainer", (), True),
        ("rollout", (), True),
        ("trainer", (0,), False),  # its large tensors live on the GPU
        ("rollout", (0, 1), False),
        ("orchestrator", (), False),
        ("reward", (), False),
        ("env", (), False),
        ("reward_server", (), False),
    ],
)
def test_only_cpu_trainer_and_engine_ranks_keep_freed_memory(role: str, gpus: tuple[int, ...], keeps: bool) -> None:
    assert _keeps_freed_memory(RankAssignment(0, role, 0, role, 0, gpus)) is keeps
