"""vLLM's environment for an in-process engine: per-TP-worker core binding on CPU."""

from __future__ import annotations

import os

import pytest

from hetrl.rollout import engine
from hetrl.rollout.engine import configure_vllm_environment

VARIABLES = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_NUM_OF_RESERVED_CPU")


@pytest.fixture
def four_cores(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)  # restored after the test
    monkeypatch.setattr(engine, "_SET_BY_HETRL", {})  # with it, what hetrl set for engines of earlier tests
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1, 2, 3})


def test_cores_split_over_tp_workers_and_a_bad_bind_is_refused(four_cores):
    configure_vllm_environment(tensor_parallel=2)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0,1|2,3"
    with pytest.raises(ValueError, match="one core list per TP worker"):
        configure_vllm_environment("0-3", tensor_parallel=2)
    with pytest.raises(ValueError, match="needs a core per TP worker"):
        configure_vllm_environment(tensor_parallel=8)


def test_a_later_engine_in_the_process_gets_its_own_bind(four_cores):
    """CI once ran a TP=1 engine, then a TP=2 one in the same process: the first bind stuck and vLLM asserted."""
    configure_vllm_environment(tensor_parallel=1)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0,1,2,3"
    configure_vllm_environment(tensor_parallel=2)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0,1|2,3"
    configure_vllm_environment("1|3", tensor_parallel=2)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "1|3"


def test_a_site_bind_wins_but_must_fit_the_tp_size(four_cores, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "2-3")
    configure_vllm_environment(tensor_parallel=1)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "2-3"
    with pytest.raises(ValueError, match="names 1 core list"):
        configure_vllm_environment(tensor_parallel=2)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    configure_vllm_environment(tensor_parallel=2)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
