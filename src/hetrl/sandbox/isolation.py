"""Which isolation this machine allows, found once at start-up by trying it.

Unprivileged user namespaces (what bubblewrap needs when it is not setuid) are site policy on
clusters: some allow them, some do not. So nothing is assumed: ``detect_isolation`` runs a tiny
program under the very bwrap flags the sandbox uses, with and without the seccomp filter, and
reports what worked. ``require_isolation`` turns a missing sandbox into a refusal unless the
recipe opted in (``reward.sandbox.allow_unisolated``), in which case it warns loudly.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass

from hetrl.sandbox.seccomp import build_filter

log = logging.getLogger(__name__)

# Paths bound read-only into every probe; the sandbox binds the recipe's list instead.
_PROBE_BINDS = ("/usr", "/lib", "/lib64", "/bin")


@dataclass(frozen=True)
class IsolationReport:
    """What the sandbox can rely on here. ``level`` is "bwrap+seccomp", "bwrap" or "none"."""

    level: str
    bwrap: str | None
    prlimit: str | None
    seccomp: bool
    per_slot_uid: bool  # running as root: each pool slot gets its own uid, so RLIMIT_NPROC holds per slot
    detail: str

    @property
    def isolated(self) -> bool:
        return self.level != "none"


def bind_args(paths: tuple[str, ...] | list[str]) -> list[str]:
    """bwrap arguments binding ``paths`` read-only; merged-/usr symlinks (/lib -> usr/lib) stay symlinks."""
    args: list[str] = []
    for path in paths:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def _probe(bwrap: str, seccomp_filter: bytes | None) -> tuple[bool, str]:
    argv = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--die-with-parent",
        "--new-session",
        "--disable-userns",
        *bind_args(_PROBE_BINDS),
    ]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    pass_fds: tuple[int, ...] = ()
    fd = -1
    if seccomp_filter is not None:
        fd = os.memfd_create("hetrl-seccomp-probe", 0)
        os.write(fd, seccomp_filter)
        os.lseek(fd, 0, os.SEEK_SET)
        argv += ["--seccomp", str(fd)]
        pass_fds = (fd,)
    try:
        done = subprocess.run([*argv, "--", "/bin/true"], pass_fds=pass_fds, capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    finally:
        if fd >= 0:
            os.close(fd)
    return done.returncode == 0, done.stderr.decode(errors="replace").strip()[-400:]


@functools.cache
def detect_isolation(bwrap: str = "bwrap") -> IsolationReport:
    """Probe bubblewrap (namespaces, then the seccomp filter) and prlimit; cached per process."""
    prlimit = shutil.which("prlimit")
    bwrap_path = shutil.which(bwrap)
    per_slot_uid = os.geteuid() == 0
    if bwrap_path is None:
        return IsolationReport(
            "none",
            None,
            prlimit,
            False,
            per_slot_uid,
            f"{bwrap!r} not found (Debian/Ubuntu: apt-get install bubblewrap)",
        )
    ok, why = _probe(bwrap_path, None)
    if not ok:
        return IsolationReport(
            "none", bwrap_path, prlimit, False, per_slot_uid, f"bwrap cannot create namespaces here: {why}"
        )
    seccomp_filter = build_filter()
    if seccomp_filter is None:
        return IsolationReport(
            "bwrap", bwrap_path, prlimit, False, per_slot_uid, "seccomp filter not built for this architecture"
        )
    ok, why = _probe(bwrap_path, seccomp_filter)
    if not ok:
        return IsolationReport("bwrap", bwrap_path, prlimit, False, per_slot_uid, f"seccomp filter refused: {why}")
    return IsolationReport(
        "bwrap+seccomp", bwrap_path, prlimit, True, per_slot_uid, "namespaces, read-only binds and seccomp available"
    )


def require_isolation(report: IsolationReport, allow_unisolated: bool) -> None:
    """Refuse to run untrusted code without isolation unless explicitly allowed (then warn loudly)."""
    if report.prlimit is None:
        raise RuntimeError("prlimit (util-linux) not found: the sandbox cannot set resource limits without it")
    if report.isolated:
        return
    if not allow_unisolated:
        raise RuntimeError(
            f"no sandbox isolation on this machine ({report.detail}); refusing to run untrusted code. "
            "Install bubblewrap / enable unprivileged user namespaces, or set reward.sandbox.allow_unisolated=true "
            "to run WITHOUT isolation (only on a machine you would let the policy own)."
        )
    banner = "!" * 78
    log.warning(
        "\n%s\nUNISOLATED SANDBOX: untrusted programs run with rlimits only and can read/write this host and reach "
        "the network (%s). Enabled by reward.sandbox.allow_unisolated=true.\n%s",
        banner,
        report.detail,
        banner,
    )
