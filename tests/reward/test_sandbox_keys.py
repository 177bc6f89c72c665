"""Every ``reward.sandbox.*`` key reaches the sandbox in a run: a changed value changes behaviour.

Scoring goes through ``Rubric.from_config(RewardConfig(functions=[code], sandbox=...))`` as the
reward role builds it, so what is tested is the recipe's value arriving at the process layer, not
a hand-built pool. Each limit case is a pair of configs differing in that one key: a program
within the limit on one side and past it on the other scores 1 and 0. The static scan is off
(``static_scan: false``): these programs fork, open files and call ptrace on purpose, and what
is under test is the sandbox, not the scanner.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from hetrl.config.reward import RewardConfig, SandboxConfig
from hetrl.records import Sample
from hetrl.reward.rubric import Rubric
from hetrl.sandbox import IsolationReport, SandboxPool, detect_isolation

ISOLATION = detect_isolation()
needs_isolation = pytest.mark.skipif(not ISOLATION.isolated, reason=f"needs sandbox isolation: {ISOLATION.detail}")
needs_root = pytest.mark.skipif(not ISOLATION.per_slot_uid, reason="per-slot uids need root")
DEFAULT_BINDS = SandboxConfig().ro_binds


def sample(code: str, expected) -> Sample:
    answer = {"calls": [{"fn": "f", "args": [], "expected": expected}]}
    return Sample("s", "g", "code", [1], [2], [1], [0.0], [0], completion_text=f"```python\n{code}```", answer=answer)


def rubric(sandbox: dict, **kwargs) -> Rubric:
    return Rubric.from_config(
        RewardConfig(functions=[{"name": "code", "kwargs": {"static_scan": False, **kwargs}}], sandbox=sandbox)
    )


def score(sandbox: dict, code: str, expected) -> float:
    r = rubric(sandbox)
    try:
        return r.score(sample(code, expected)).total
    finally:
        r.close()


def limits(**values) -> dict:
    return {"limits": values}


# key -> (program defining f(), what f() must return, sandbox that stops it, sandbox that lets it pass)
KEYS = {
    "limits.wall_s": (
        "import time\ndef f():\n    time.sleep(1.0)\n    return 1\n",
        1,
        limits(wall_s=0.5),
        limits(wall_s=8),
    ),
    "limits.cpu_s": (
        "import time\ndef f():\n    while time.process_time() < 1.1:\n        pass\n    return 1\n",
        1,
        limits(cpu_s=1, wall_s=30),
        limits(cpu_s=2, wall_s=30),
    ),
    "limits.memory_mb": (
        "def f():\n    return len(bytearray(150 << 20)) > 0\n",
        True,
        limits(memory_mb=100),
        limits(memory_mb=400),
    ),
    "limits.max_processes": (
        "import os, time\ndef f():\n    n = 0\n    for _ in range(8):\n        try:\n            pid = os.fork()\n    "
        "    except OSError:\n"
        "            break\n        if pid == 0:\n            time.sleep(0.3)\n            os._exit(0)\n        n += "
        "1\n    return n\n",
        8,
        limits(max_processes=4),
        limits(max_processes=16),
    ),
    "limits.max_open_files": (
        "import os\ndef f():\n    return len([os.open('/dev/null', os.O_RDONLY) for _ in range(40)])\n",
        40,
        limits(max_open_files=16),
        limits(max_open_files=64),
    ),
    "limits.max_output_bytes": (
        "def f():\n    print('x' * 100000, flush=True)\n    return 1\n",
        1,
        limits(max_output_bytes=32768),
        limits(max_output_bytes=1 << 20),
    ),
    "limits.max_file_bytes": (
        "def f():\n    open('big', 'wb').write(b'x' * (3 << 20))\n    return 1\n",
        1,
        limits(max_file_bytes=1 << 20),
        limits(max_file_bytes=8 << 20),
    ),
    "limits.tmpfs_mb": (
        "def f():\n    open('/tmp/big', 'wb').write(b'x' * (3 << 20))\n    return 1\n",
        1,
        limits(tmpfs_mb=2),
        limits(tmpfs_mb=8),
    ),
    "ro_binds": (
        "import os\ndef f():\n    return os.path.exists('/etc/os-release')\n",
        True,
        {"ro_binds": DEFAULT_BINDS},
        {"ro_binds": [*DEFAULT_BINDS, "/etc/os-release"]},
    ),
    "seccomp": (
        "import ctypes\ndef f():\n    return ctypes.CDLL(None, use_errno=True).ptrace(0, 0, 0, 0)\n",
        0,  # PTRACE_TRACEME
        {"seccomp": True},
        {"seccomp": False},
    ),
    "uid_base": ("import os\ndef f():\n    return os.getuid()\n", 62000, {"uid_base": 61000}, {"uid_base": 62000}),
}
MARKS = {
    "ro_binds": [needs_isolation],
    "uid_base": [needs_root],
    "seccomp": [pytest.mark.skipif(not ISOLATION.seccomp, reason="no seccomp here")],
}


@pytest.mark.parametrize("key", [pytest.param(k, marks=MARKS.get(k, [needs_isolation])) for k in KEYS])
def test_key_changes_the_verdict(key):
    code, expected, stops, passes = KEYS[key]
    with ThreadPoolExecutor(2) as both:  # side by side: the cpu_s pair alone burns 2 s of CPU
        passed, stopped = both.map(lambda sandbox: score(sandbox, code, expected), [passes, stops])
    assert passed == 1.0, f"{key}: {passes} should let the program pass"
    assert stopped == 0.0, f"{key}: {stops} should stop the program"


@pytest.fixture
def host_dir_in_tmp():
    """A directory under /tmp that the slot uids may read (pytest's tmp_path is private to root)."""
    path = tempfile.mkdtemp(prefix="hetrl-bind-")
    os.chmod(path, 0o755)
    with open(os.path.join(path, "data.txt"), "w") as fh:
        fh.write("from the host")
    os.chmod(os.path.join(path, "data.txt"), 0o644)
    yield path
    shutil.rmtree(path)


@needs_isolation
def test_ro_binds_inside_the_private_tmp_show(host_dir_in_tmp):
    """A bind under /tmp (or /work) is mounted after the sandbox's own tmpfs there, not hidden by it."""
    code = f"def f():\n    return open({host_dir_in_tmp + '/data.txt'!r}).read()\n"
    assert score({}, code, "from the host") == 0.0
    assert score({"ro_binds": [*DEFAULT_BINDS, host_dir_in_tmp]}, code, "from the host") == 1.0


@pytest.mark.parametrize("bind", ["/tmp", "/work/"])
def test_ro_binds_replacing_the_private_mounts_fail_at_start(bind):
    with pytest.raises(ValueError, match="would replace the sandbox's own"):
        rubric({"ro_binds": [*DEFAULT_BINDS, bind]})


@needs_isolation
def test_python_is_the_configured_interpreter():
    real = os.path.realpath(SandboxConfig().python)  # e.g. /usr/bin/python3.11 for the default /usr/bin/python3
    if real == SandboxConfig().python:
        pytest.skip("the default interpreter is not a link: no second name for it")
    code = "import sys\ndef f():\n    return sys.executable\n"
    assert score({}, code, real) == 0.0
    assert score({"python": real}, code, real) == 1.0


@pytest.mark.parametrize("python, why", [("/no/such/python3", "no executable file"), ("python3", "absolute path")])
def test_python_elsewhere_fails_at_start(python, why):
    with pytest.raises(ValueError, match=rf"reward\.sandbox\.python=.*{why}"):
        rubric({"python": python})


@needs_isolation
def test_python_outside_the_binds_fails_at_start(tmp_path):
    exe = tmp_path / "python3"
    shutil.copy(os.path.realpath(SandboxConfig().python), exe)
    with pytest.raises(ValueError, match="not visible inside the sandbox"):
        rubric({"python": str(exe)})


def _peak_overlap(spans: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    peak = now = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


@pytest.mark.parametrize("workers", [1, 3])
def test_workers_is_how_many_run_at_once(workers):
    r = rubric({"workers": workers})
    try:
        [pool] = r.owned  # the one sandbox pool the rubric built
        assert pool.size == workers
        job = {"code": "import time\nt = time.time()\ntime.sleep(0.8)\nprint(t, time.time())\n"}
        results = pool.map([job] * (workers + 1))  # one more than the slots: the cap shows
    finally:
        r.close()
    assert all(res.success for res in results), [res.reason for res in results]
    assert _peak_overlap([tuple(map(float, res.stdout.split())) for res in results]) == workers


NO_BWRAP = IsolationReport("none", None, shutil.which("prlimit"), False, False, "bwrap missing (test)")


def test_allow_unisolated_when_bwrap_is_missing(monkeypatch):
    monkeypatch.setattr("hetrl.sandbox.pool.detect_isolation", lambda: NO_BWRAP)
    with pytest.raises(RuntimeError, match="refusing to run untrusted code"):
        rubric({"allow_unisolated": False})
    code = (
        "import os\ndef f():\n    return os.getcwd().startswith('/tmp/hetrl-unisolated-')\n"  # a host dir: no namespace
    )
    assert score({"allow_unisolated": True}, code, True) == 1.0


# --------------------------------------------------------------------------- the rubric's pool


def test_one_pool_shared_built_only_when_needed_and_closed():
    assert Rubric.from_config(RewardConfig(functions=[{"name": "format"}])).owned == []
    config = RewardConfig(
        functions=[{"name": "code"}, {"name": "code", "source": "code2", "weight": 0.0}], sandbox={"workers": 3}
    )
    r = Rubric.from_config(config)
    [pool] = r.owned
    assert pool.config == config.sandbox and {wf.fn._pool for wf in r.functions} == {pool}
    r.close()
    with pytest.raises(RuntimeError):  # closed with the rubric
        pool.submit("pass")


def test_a_supplied_pool_is_used_and_left_open():
    with SandboxPool(SandboxConfig(workers=1)) as pool:
        r = Rubric.from_config(RewardConfig(functions=[{"name": "code"}]), resources={"sandbox_pool": pool})
        assert r.owned == [] and r.functions[0].fn._pool is pool
        r.close()
        assert pool.submit("pass").result().success


def test_function_limits_override_only_what_they_name():
    r = rubric(limits(memory_mb=300, wall_s=3), limits={"wall_s": 1.5})
    try:
        assert r.functions[0].fn.limits.wall_s == 1.5 and r.functions[0].fn.limits.memory_mb == 300
    finally:
        r.close()


# --------------------------------------------------------------------------- the environments' sandbox


@needs_isolation
def test_the_environments_sandbox_follows_reward_sandbox(monkeypatch):
    from hetrl.config.env import EnvConfig
    from hetrl.env import registry

    monkeypatch.setattr(registry, "_shared", None)
    config = SandboxConfig(workers=1, limits={"wall_s": 0.5})
    make = registry.env_factory(EnvConfig(name="code"), sandbox=config)
    runner = make().runner
    try:
        assert runner.pool.config == config and make().runner is runner  # one pool per process
        start = time.monotonic()
        result = asyncio.run(runner.run("import time; time.sleep(3)"))
        assert result.timeout and time.monotonic() - start < 2.5
        with pytest.raises(RuntimeError, match="built with other reward.sandbox settings"):
            registry.env_factory(EnvConfig(name="code"), sandbox=SandboxConfig(workers=2))()
    finally:
        runner.close()
