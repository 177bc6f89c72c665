"""Hostile programs: each must be contained within its limits, fail with a reason, and leave the pool serving."""

import os
import socket
import subprocess
import threading
import time

import pytest

from hetrl.config.reward import SandboxConfig, SandboxLimits
from hetrl.sandbox import Sandbox, SandboxPool

BASE_UID = SandboxConfig().uid_base
LIMITS = SandboxLimits(wall_s=4.0, cpu_s=2, memory_mb=256, max_processes=16, max_output_bytes=64 * 1024, tmpfs_mb=16)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(workers=2, limits=LIMITS)) as p:
        yield p


@pytest.fixture(autouse=True)
def still_serving(pool, needs_isolation, tasks_of_uid):
    yield
    result = pool.run("print(6 * 7)")
    assert result.success and result.stdout == "42\n", result
    if needs_isolation.per_slot_uid:
        deadline = time.monotonic() + 2
        while any(tasks_of_uid(BASE_UID + i) for i in range(pool.size)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(tasks_of_uid(BASE_UID + i) for i in range(pool.size)), "sandboxed processes outlived their run"


FORK_BOMB = """
import os, sys
forks = 0
while True:
    try:
        os.fork(); forks += 1
    except OSError:
        if forks >= 0:
            print(f"EAGAIN after {forks}", flush=True); forks = -10**9
"""


def test_fork_bomb_hits_process_limit_then_deadline(pool, needs_isolation):
    r = pool.run(FORK_BOMB, limits=LIMITS.model_copy(update={"wall_s": 2.0}))
    assert not r.success and (r.timeout or r.output_truncated), r.reason
    first = int(r.stdout.splitlines()[0].split()[-1])
    assert first <= LIMITS.max_processes
    assert r.wall_s < 4.0


def test_memory_bomb(pool):
    r = pool.run("a = []\nwhile True:\n    a.append(bytearray(16 << 20))")
    assert not r.success and r.memory_exceeded and r.reason.startswith("memory limit"), r


def test_infinite_loop_hits_cpu_limit(pool):
    r = pool.run("while True: pass", limits=LIMITS.model_copy(update={"cpu_s": 1, "wall_s": 10.0}))
    assert not r.success and not r.timeout and r.reason.startswith("cpu limit"), (
        r
    )  # the CPU limit, not the deadline, stopped it


def test_signal_ignoring_sleep_killed_at_deadline(pool):
    code = (
        "import signal, time\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGXCPU): "
        "signal.signal(s, signal.SIG_IGN)\ntime.sleep(100)"
    )
    r = pool.run(code, limits=LIMITS.model_copy(update={"wall_s": 1.0}))
    assert r.timeout and not r.success and "deadline" in r.reason
    assert r.wall_s < 2.0


def test_no_network(pool, needs_isolation):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    code = f"""
import socket
for addr in [("127.0.0.1", {port}), ("1.1.1.1", 53)]:
    try:
        socket.create_connection(addr, timeout=1); print("OPEN", addr)
    except OSError as e:
        print("BLOCKED", addr, e.errno)
"""
    r = pool.run(code)
    assert "OPEN" not in r.stdout and r.stdout.count("BLOCKED") == 2, r
    with pytest.raises(socket.timeout):
        server.accept()
    server.close()


def test_cannot_read_host_files(pool, tmp_path, needs_isolation):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    code = f"""
import os
for p in [{str(secret)!r}, "/etc/shadow", "/etc/passwd", "/root", {os.getcwd()!r}, "/proc/1/root/etc/shadow"]:
    try:
        print(p, "READ", open(p).read()[:20] if os.path.isfile(p) else os.listdir(p)[:3])
    except OSError as e:
        print(p, "DENIED", type(e).__name__)
"""
    r = pool.run(code)
    assert "TOPSECRET" not in r.stdout and "READ" not in r.stdout, r.stdout
    assert r.stdout.count("DENIED") == 6


def test_cannot_write_outside(pool, tmp_path, needs_isolation):
    target = tmp_path / "pwned.txt"
    code = f"""
for p in [{str(target)!r}, "/usr/pwned", "/etc/pwned", "/work/ok.txt", "/tmp/ok.txt"]:
    try:
        open(p, "w").write("x"); print(p, "WROTE")
    except OSError as e:
        print(p, "DENIED", type(e).__name__)
"""
    r = pool.run(code)
    assert not target.exists() and not os.path.exists("/usr/pwned")
    assert r.stdout.count("DENIED") == 3 and r.stdout.count("WROTE") == 2, r.stdout


def test_killing_the_parent_and_everyone(needs_isolation):
    if not needs_isolation.per_slot_uid:
        pytest.skip("needs root to run the sentinel as the slot's uid")
    sentinel = subprocess.Popen(["sleep", "30"], user=BASE_UID + 5, group=BASE_UID + 5)
    try:
        sandbox = Sandbox(SandboxConfig(limits=LIMITS), slot=5)
        code = (
            "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)\nos.kill(1, "
            "signal.SIGKILL)\nprint('survived')"
        )
        r = sandbox.run(code)
        assert not r.success and r.reason, r
        assert sentinel.poll() is None, "a sandboxed program killed a host process of its own uid"
        assert sandbox.run("print('next')").stdout == "next\n"
    finally:
        sentinel.kill()
        sentinel.wait()


def test_huge_output_truncated(pool):
    r = pool.run("import sys\nwhile True: sys.stdout.write('x' * 65536)")
    assert r.output_truncated and not r.success and r.reason.startswith("output limit"), r.reason
    assert len(r.stdout) == LIMITS.max_output_bytes


def test_child_outliving_its_parent_is_killed(pool, tmp_path, needs_isolation):
    code = (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        "
        "time.sleep(60)\n    os._exit(0)\nprint('parent done')"
    )
    start = time.monotonic()
    r = pool.run(code)
    assert r.success and r.stdout == "parent done\n"
    assert time.monotonic() - start < 2.0  # the orphan's open stdout did not hold the run to its deadline


def test_pool_serves_concurrently(pool):
    results = pool.map([{"code": f"print({i} * {i})"} for i in range(8)])
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(8)]
    assert threading.active_count() < 50


def test_stdin_and_sys_exit_code(pool):
    r = pool.run("import sys\nprint(sys.stdin.read().upper())\nsys.exit(3)", stdin="abc")
    assert r.stdout == "ABC\n" and r.exit_code == 3 and r.reason == "exit code 3" and not r.success


def test_seccomp_denies_ptrace_and_namespaces(pool, needs_isolation):
    if not needs_isolation.seccomp:
        pytest.skip("seccomp unavailable here")
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(libc.ptrace(0, 0, 0, 0), "
        "ctypes.get_errno())\nprint(libc.unshare(0x10000000), ctypes.get_errno())"
    )
    r = pool.run(code)
    assert r.stdout.split() == ["-1", "1", "-1", "1"], r


def test_readonly_files_cannot_be_modified(pool, needs_isolation):
    code = (
        "import os\ntry:\n    open('tests.json', 'w').write('{}')\nexcept OSError as e: print('DENIED', "
        "e.errno)\ntry:\n    os.unlink('tests.json')\nexcept OSError as e: print('DENIED', "
        "e.errno)\nprint(open('tests.json').read())"
    )
    r = pool.run(code, ro_files={"tests.json": "[1, 2]"})
    assert r.stdout.count("DENIED") == 2 and r.stdout.endswith("[1, 2]\n"), r.stdout


def test_caller_errors_raise():
    with pytest.raises(ValueError, match="exactly one"):
        Sandbox(SandboxConfig()).run()
    with pytest.raises(ValueError, match="relative path"):
        Sandbox(SandboxConfig()).run("pass", files={"../x": "y"})
