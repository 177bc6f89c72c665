"""vLLM's environment for an in-process engine: per-TP-worker core binding on CPU."""

from __future__ import annotations

import os

import pytest

from hetrl.rollout.engine import configure_vllm_environment


def test_cores_split_over_tp_workers_and_a_bad_bind_is_refused(monkeypatch):
    for name in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_NUM_OF_RESERVED_CPU"):
        monkeypatch.delenv(name, raising=False)  # restored after the test
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1, 2, 3})
    configure_vllm_environment(tensor_parallel=2)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0,1|2,3"
    with pytest.raises(ValueError, match="one core list per TP worker"):
        configure_vllm_environment("0-3", tensor_parallel=2)
    with pytest.raises(ValueError, match="needs a core per TP worker"):
        configure_vllm_environment(tensor_parallel=8)
