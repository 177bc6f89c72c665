"""Shared fixture: a synthetic run directory written through the real Monitor."""

from __future__ import annotations

from pathlib import Path

import pytest
from monitor_synth import write_run


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("run") / "tiny")
