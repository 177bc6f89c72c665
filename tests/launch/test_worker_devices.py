"""Each rollout rank sees only its engine's GPUs (the plan's local ids, mapped through Slurm's view)."""

from __future__ import annotations

import os

import pytest

from hetrl.control.plan import RankAssignment
from hetrl.launch.worker import _bind_engine_gpus, visible_devices


def test_plan_gpu_ids_map_through_the_inherited_view() -> None:
    assert visible_devices((2, 3), None) == "2,3"
    assert visible_devices((0, 1), "4,5,6,7") == "4,5"
    assert visible_devices((1,), "GPU-aa, GPU-bb") == "GPU-bb"
    with pytest.raises(RuntimeError, match="shows 2"):
        visible_devices((2,), "0,1")


def test_only_rollout_ranks_are_narrowed(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    _bind_engine_gpus(RankAssignment(0, "trainer", 0, "train", 0, (3,)))
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    _bind_engine_gpus(RankAssignment(8, "rollout", 1, "rollout", 0, (4, 5, 6, 7)))
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
