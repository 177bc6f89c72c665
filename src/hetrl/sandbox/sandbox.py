"""Run one untrusted program: bubblewrap namespaces + seccomp + rlimits, result as a dataclass.

Contract (what is and is not covered):

* Covered, per execution: no network (empty network namespace); the host file system is
  invisible except the read-only binds of ``SandboxConfig.ro_binds`` (system paths, by default
  /usr and the merged-/usr symlinks); /tmp and the working directory /work are private tmpfs
  mounts of ``tmpfs_mb`` each, gone after the run; a PID namespace whose every process dies at
  the wall deadline; rlimits on CPU time, address space, processes, open files and file size;
  stdout/stderr capped (the program is killed past the cap); seccomp deny-list (see seccomp.py);
  no new user namespaces; a new session (no TIOCSTI into the caller's terminal). As root, pool
  slot i runs as uid ``uid_base + i`` so the process limit is per slot; as a normal user the
  process limit counts all of that user's processes, so it is set to the current count + the
  limit (approximate under concurrency).
* Not covered: memory is limited per process (RLIMIT_AS), not per tree (no cgroup delegation
  assumed); CPU side channels; kernel exploits beyond the seccomp list. Without bubblewrap
  (``allow_unisolated``) only the rlimits, the deadline and the process-group kill remain: the
  program can read the host, use the network and escape the group with setsid().

``Sandbox.run`` never raises because of what the program does: every failure, including a
failure of the sandbox itself, comes back as an ``ExecutionResult`` with ``reason`` set.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass

from hetrl.config.reward import SandboxConfig, SandboxLimits
from hetrl.sandbox.isolation import IsolationReport, bind_args, detect_isolation, require_isolation
from hetrl.sandbox.process import Supervised, supervise
from hetrl.sandbox.seccomp import build_filter

log = logging.getLogger(__name__)

WORKDIR = "/work"
CHANNEL_ENV = "HETRL_CHANNEL_FD"  # fd number of the write end of the harness channel, when one is asked for
_MEMORY_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")
_MIB = 1 << 20


@dataclass
class ExecutionResult:
    """Outcome of one sandboxed execution. ``success`` = exited 0 within every limit."""

    success: bool
    exit_code: int | None
    stdout: str
    stderr: str
    timeout: bool
    memory_exceeded: bool
    output_truncated: bool
    reason: str
    wall_s: float
    signal: int | None = None
    channel: bytes = b""  # what the harness wrote to the channel fd (when ``channel=True``)

    @classmethod
    def failure(cls, reason: str, wall_s: float = 0.0) -> ExecutionResult:
        return cls(False, None, "", "", False, False, False, reason, wall_s)


def _check_name(name: str) -> str:
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"sandbox file name {name!r} must be a relative path without '.', '..' or empty parts")
    return name


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(f"hetrl-{os.path.basename(name)}", 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _as_bytes(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else data


def _count_user_tasks(uid: int) -> int:
    """Threads of ``uid`` now alive (RLIMIT_NPROC counts threads of the real uid)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid == uid:
                total += len(os.listdir(f"/proc/{entry}/task"))
        except OSError:
            continue
    return total


def _namespace_init(streams: dict[str, bytes]) -> int | None:
    """Host pid of the sandbox's PID-namespace init, from bwrap's --info-fd JSON."""
    try:
        return int(json.loads(streams.get("info", b"") or b"{}")["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


_OWN_MOUNTS = ("/proc", "/dev", "/tmp", WORKDIR)


def _under(path: str, root: str) -> bool:
    path, root = os.path.normpath(path), os.path.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def _under_own_mount(path: str) -> bool:
    return any(_under(path, mount) for mount in _OWN_MOUNTS)


def check_binds(config: SandboxConfig) -> None:
    """Refuse a bind that would replace one of the sandbox's own mounts (its private /tmp, /work, /proc, /dev)."""
    clash = [b for b in config.ro_binds if any(os.path.normpath(b) == mount for mount in _OWN_MOUNTS)]
    if clash:
        raise ValueError(
            f"reward.sandbox.ro_binds {clash} would replace the sandbox's own {', '.join(_OWN_MOUNTS)}: "
            "bind a path inside them instead"
        )


def check_python(config: SandboxConfig, isolation: IsolationReport) -> str:
    """``config.python`` if it can run in this sandbox; otherwise a ValueError naming the key and why.

    Caught here, a wrong interpreter fails the run at start instead of scoring every program 0.
    Under isolation the path (and its target, if a link) must lie under one of ``ro_binds``.
    """
    python = config.python
    where = f"reward.sandbox.python={python!r}"
    if not os.path.isabs(python):
        raise ValueError(f"{where} must be an absolute path")
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise ValueError(f"{where}: no executable file there on this host")
    if isolation.isolated:
        binds = [b for b in config.ro_binds if os.path.lexists(b)]
        real_binds = [os.path.realpath(b) for b in binds]
        if not any(_under(python, b) for b in binds) or not any(
            _under(os.path.realpath(python), b) for b in real_binds
        ):
            raise ValueError(
                f"{where} is not visible inside the sandbox: it (and {os.path.realpath(python)!r}) must lie "
                f"under one of reward.sandbox.ro_binds={list(config.ro_binds)}"
            )
    return python


class Sandbox:
    """One execution slot. Thread-compatible: one ``run`` at a time per instance (the pool ensures it)."""

    def __init__(
        self, config: SandboxConfig | None = None, slot: int = 0, isolation: IsolationReport | None = None
    ) -> None:
        self.config = config or SandboxConfig()
        self.isolation = isolation or detect_isolation()
        require_isolation(self.isolation, self.config.allow_unisolated)
        self._seccomp = build_filter() if self.config.seccomp and self.isolation.seccomp else None
        self._uid = self.config.uid_base + slot if self.isolation.per_slot_uid else None
        check_binds(self.config)
        self._python = check_python(self.config, self.isolation)

    def run(
        self,
        code: str | None = None,
        *,
        argv: list[str] | None = None,
        files: dict[str, str | bytes] | None = None,
        ro_files: dict[str, str | bytes] | None = None,
        stdin: str | bytes | None = None,
        limits: SandboxLimits | None = None,
        channel: bool = False,
    ) -> ExecutionResult:
        """Run Python ``code`` (as /work/main.py) or ``argv`` in /work.

        ``files`` are writable copies in /work, ``ro_files`` read-only ones (harness, inputs).
        With ``channel=True`` the program inherits a pipe whose fd number is in $HETRL_CHANNEL_FD;
        its content comes back in ``ExecutionResult.channel``.
        """
        if (code is None) == (argv is None):
            raise ValueError("Sandbox.run needs exactly one of code= or argv=")
        files = {_check_name(k): _as_bytes(v) for k, v in (files or {}).items()}
        ro_files = {_check_name(k): _as_bytes(v) for k, v in (ro_files or {}).items()}
        if code is not None:
            files["main.py"] = code.encode()
            argv = [self._python, "-B", "-s", "main.py"]
        limits = limits or self.config.limits
        try:
            return self._execute(list(argv), files, ro_files, _as_bytes(stdin) if stdin else None, limits, channel)
        except Exception as exc:  # a sandbox fault must not reach the rollout loop either
            log.exception("sandbox failure")
            return ExecutionResult.failure(f"sandbox error: {type(exc).__name__}: {exc}")

    def _prlimit(self, limits: SandboxLimits) -> list[str]:
        nproc = limits.max_processes + 2  # + outer bwrap and the namespace's init, same uid
        if self._uid is None:
            nproc += _count_user_tasks(os.getuid())
        return [
            self.isolation.prlimit,
            f"--as={limits.memory_mb * _MIB}",
            f"--cpu={limits.cpu_s}",
            f"--nproc={nproc}",
            f"--nofile={limits.max_open_files}",
            f"--fsize={limits.max_file_bytes}",
            "--core=0",
            "--",
        ]

    def _execute(self, argv, files, ro_files, stdin, limits: SandboxLimits, channel: bool) -> ExecutionResult:
        fds: list[int] = []
        extra: dict[str, int] = {}
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": WORKDIR,
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        if self.isolation.isolated:  # bwrap reports its namespace init's pid here
            info_read, info_write = os.pipe()
            extra["info"] = info_read
            fds.append(info_write)
        if channel:
            read_end, write_end = os.pipe()
            extra["channel"] = read_end
            fds.append(write_end)
            env[CHANNEL_ENV] = str(write_end)
        tmpdir = None
        try:
            if self.isolation.isolated:
                cmd = self._bwrap_argv(files, ro_files, env, limits, fds) + self._prlimit(limits) + argv
                run_env, cwd = {}, None
            else:
                tmpdir = tempfile.mkdtemp(prefix="hetrl-unisolated-")
                self._write_unisolated(tmpdir, files, ro_files)
                cmd, run_env, cwd = self._prlimit(limits) + argv, {**env, "HOME": tmpdir, "TMPDIR": tmpdir}, tmpdir
            raw = supervise(
                cmd,
                deadline_s=limits.wall_s,
                max_output_bytes=limits.max_output_bytes,
                stdin=stdin,
                extra_reads=extra,
                pass_fds=tuple(fds),
                env=run_env,
                cwd=cwd,
                user=self._uid,
                inner_pid=_namespace_init,
            )
        finally:
            if tmpdir is not None:
                shutil.rmtree(tmpdir, ignore_errors=True)
        return self._interpret(raw, limits)

    def _bwrap_argv(self, files, ro_files, env, limits: SandboxLimits, fds: list[int]) -> list[str]:
        size = str(limits.tmpfs_mb * _MIB)
        # fds[0] is the info pipe (made first). --as-pid-1: the program is the namespace init, so
        # outer bwrap reaps it (bwrap's own reaper would be orphaned to the host's init as a zombie).
        cmd = [self.isolation.bwrap, "--info-fd", str(fds[0]), "--unshare-all", "--unshare-user", "--disable-userns"]
        cmd += ["--die-with-parent", "--as-pid-1", "--new-session", "--clearenv"]
        for key, value in env.items():
            cmd += ["--setenv", key, value]
        # A bind inside one of the sandbox's own mounts (/proc, /dev, /tmp, /work) goes after that
        # mount, or the mount would hide it; every other bind goes first, so a bind of a parent
        # (say /) cannot cover the private /tmp and /work.
        inner = [b for b in self.config.ro_binds if _under_own_mount(b)]
        cmd += bind_args([b for b in self.config.ro_binds if b not in inner])
        cmd += [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            size,
            "--tmpfs",
            "/tmp",
            "--size",
            size,
            "--tmpfs",
            WORKDIR,
        ]
        cmd += bind_args(inner)
        dirs = sorted({os.path.dirname(n) for n in [*files, *ro_files] if "/" in n})
        for d in dirs:
            cmd += ["--dir", f"{WORKDIR}/{d}"]
        for flag, group in (("--file", files), ("--ro-bind-data", ro_files)):
            for name, data in group.items():
                fd = _memfd(name, data)
                fds.append(fd)
                cmd += [flag, str(fd), f"{WORKDIR}/{name}"]
        if self._seccomp is not None:
            fd = _memfd("seccomp", self._seccomp)
            fds.append(fd)
            cmd += ["--seccomp", str(fd)]
        return cmd + ["--remount-ro", "/", "--chdir", WORKDIR, "--"]

    @staticmethod
    def _write_unisolated(root: str, files, ro_files) -> None:
        for mode, group in ((0o644, files), (0o444, ro_files)):
            for name, data in group.items():
                path = os.path.join(root, name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as fh:
                    fh.write(data)
                os.chmod(path, mode)

    def _interpret(self, raw: Supervised, limits: SandboxLimits) -> ExecutionResult:
        stdout = raw.streams.get("stdout", b"").decode(errors="replace")
        stderr = raw.streams.get("stderr", b"").decode(errors="replace")
        status = raw.exit_status
        sig = -status if status < 0 else (status - 128 if self.isolation.isolated and 128 < status < 160 else None)
        timeout = raw.killed_for == "deadline"
        truncated = bool(raw.truncated)
        # Not the tree's peak RSS: a child forked from a large parent (a trainer process) inherits
        # the parent's peak, so a `while True: pass` would read as 450 MiB.
        memory = any(m in stderr[-4000:] for m in _MEMORY_MARKERS)
        if timeout:
            reason = f"timeout: wall-clock deadline of {limits.wall_s:g}s exceeded, process tree killed"
        elif truncated:
            reason = (
                f"output limit: {'/'.join(sorted(raw.truncated))} exceeded {limits.max_output_bytes} bytes, process "
                f"tree killed"
            )
        elif sig == signal.SIGXCPU or (sig == signal.SIGKILL and not memory):
            # RLIMIT_CPU sends SIGXCPU at its soft limit and SIGKILL at its hard one. Nothing else
            # here sends SIGKILL: the deadline and output kills are flagged above, and RLIMIT_AS
            # makes allocations fail instead of killing. (The tree's rusage is no witness: under
            # load it once read below 0.8 s for a 1 s kill.)
            reason = f"cpu limit: {limits.cpu_s}s of CPU time exceeded"
        elif memory:
            reason = f"memory limit: address space of {limits.memory_mb} MiB exceeded"
        elif sig is not None:
            reason = f"killed by signal {signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else sig}"
        elif status != 0:
            reason = f"exit code {status}"
        else:
            reason = "ok"
        return ExecutionResult(
            success=reason == "ok",
            exit_code=status,
            stdout=stdout,
            stderr=stderr,
            timeout=timeout,
            memory_exceeded=memory and not timeout,
            output_truncated=truncated,
            reason=reason,
            wall_s=raw.wall_s,
            signal=sig,
            channel=raw.streams.get("channel", b""),
        )
