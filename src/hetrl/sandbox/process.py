"""Run one process tree under a wall-clock deadline with bounded output; never hang, never raise on the program.

The process starts in its own session; at the deadline (or when an output stream passes its cap)
the whole process group is SIGKILLed. Under bubblewrap that group holds the outer bwrap, whose
death kills the namespace's init (``--die-with-parent``) and with it every process in the PID
namespace, including ones that called setsid() or double-forked.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

_READ_CHUNK = 65536


@dataclass
class Supervised:
    """Raw facts about one finished process; interpretation is the sandbox's job."""

    exit_status: int  # as os.waitstatus_to_exitcode: negative = killed by that signal
    streams: dict[str, bytes] = field(default_factory=dict)
    truncated: set[str] = field(default_factory=set)
    killed_for: str | None = None  # "deadline" | "output"
    wall_s: float = 0.0


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(pid: int, inner: int | None) -> None:
    """Kill ``inner`` and give its parent a moment to reap it, then kill the whole group."""
    if inner is not None:
        try:
            os.kill(inner, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        give_up = time.monotonic() + 0.5
        while time.monotonic() < give_up and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            time.sleep(0.005)
    _kill_group(pid)


def supervise(
    argv: list[str],
    *,
    deadline_s: float,
    max_output_bytes: int,
    stdin: bytes | None = None,
    extra_reads: dict[str, int] | None = None,
    pass_fds: tuple[int, ...] = (),
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    user: int | None = None,
    inner_pid: Callable[[dict[str, bytes]], int | None] | None = None,
) -> Supervised:
    """Spawn ``argv`` and collect stdout, stderr and each ``extra_reads`` pipe (name -> read fd).

    ``inner_pid`` finds, from what the streams carried so far, a process to SIGKILL before the
    group (bubblewrap's namespace init): killed first, it is reaped by its own parent instead of
    lingering as a zombie of the host's init, where it would still count against RLIMIT_NPROC.
    The caller keeps ownership of the write ends it passes in ``pass_fds`` and must close them
    after this returns (they are needed open until the child has inherited them).
    """
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=pass_fds,
        env=env,
        cwd=cwd,
        start_new_session=True,
        user=user,
        group=user,
        extra_groups=[] if user is not None else None,
    )
    for fd in pass_fds:
        os.close(fd)
    result = Supervised(exit_status=0)
    try:
        _pump(proc, result, start + deadline_s, max_output_bytes, stdin, extra_reads or {})
    finally:
        if result.killed_for is not None:
            _stop(proc.pid, inner_pid(result.streams) if inner_pid else None)
        _, status = os.waitpid(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        _kill_group(proc.pid)  # stragglers of an unisolated run that stayed in the group
        result.exit_status = proc.returncode
        result.wall_s = time.monotonic() - start
    return result


def _pump(
    proc: subprocess.Popen, result: Supervised, deadline: float, cap: int, stdin: bytes | None, extra: dict[str, int]
) -> None:
    sel = selectors.DefaultSelector()
    bufs: dict[str, bytearray] = {}
    readers = {"stdout": proc.stdout.fileno(), "stderr": proc.stderr.fileno(), **extra}
    for name, fd in readers.items():
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ, name)
        bufs[name] = bytearray()
    pending_in = memoryview(stdin) if stdin else None
    if pending_in is not None:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, "stdin")
    try:
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                result.killed_for = result.killed_for or "deadline"
                break
            for key, _ in sel.select(timeout=min(remaining, 1.0)):
                if key.data == "stdin":
                    pending_in = _feed(sel, proc, pending_in)
                    continue
                chunk = _read(key.fd)
                if chunk is None:
                    continue
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                buf = bufs[key.data]
                room = cap - len(buf)
                buf += chunk[: max(room, 0)]
                if len(chunk) > room:
                    result.truncated.add(key.data)
                    result.killed_for = "output"
                    return
    finally:
        sel.close()
        for name, bb in bufs.items():
            result.streams[name] = bytes(bb)
        for fd in extra.values():
            os.close(fd)
        proc.stdout.close()
        proc.stderr.close()
        if proc.stdin is not None and not proc.stdin.closed:
            try:
                proc.stdin.close()
            except OSError:
                pass


def _read(fd: int) -> bytes | None:
    """Bytes available on ``fd``; b"" at end of stream; None after a spurious wake-up."""
    try:
        return os.read(fd, _READ_CHUNK)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _feed(sel: selectors.BaseSelector, proc: subprocess.Popen, pending: memoryview | None) -> memoryview | None:
    """Write what the child's stdin takes now; close it when all is written or the child stopped reading."""
    fd = proc.stdin.fileno()
    try:
        written = os.write(fd, pending[:_READ_CHUNK]) if pending else 0
        pending = pending[written:] if pending else None
    except BlockingIOError:
        return pending
    except OSError:  # EPIPE: the program closed stdin
        pending = None
    if not pending:
        sel.unregister(fd)
        proc.stdin.close()
        return None
    return pending
