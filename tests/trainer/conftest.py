"""Shared fixtures of the trainer tests."""

from __future__ import annotations

import pytest
from rank_pool import RankPool


@pytest.fixture(scope="session")
def two_ranks():
    """Two spawned gloo ranks (one thread each) shared by every multi-rank trainer test."""
    pool = RankPool(2)
    yield pool
    pool.close()
