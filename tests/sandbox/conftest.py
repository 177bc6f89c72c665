import os

import pytest

from hetrl.sandbox import detect_isolation

os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(items):
    if not detect_isolation().isolated:
        skip = pytest.mark.skip(reason=f"no sandbox isolation here: {detect_isolation().detail}")
        for item in items:
            if "needs_isolation" in item.fixturenames:
                item.add_marker(skip)


@pytest.fixture
def needs_isolation():
    return detect_isolation()


@pytest.fixture
def tasks_of_uid():
    """Pids on the host owned by a uid (a contained program leaves none behind)."""

    def pids(uid: int) -> list[int]:
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.stat(f"/proc/{entry}").st_uid == uid:
                        out.append(int(entry))
                except OSError:
                    pass
        return out

    return pids
