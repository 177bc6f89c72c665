import logging
import shutil

import pytest

from hetrl.config.reward import SandboxConfig, SandboxLimits
from hetrl.sandbox import IsolationReport, Sandbox, detect_isolation, require_isolation
from hetrl.sandbox.seccomp import build_filter

NONE = IsolationReport("none", None, shutil.which("prlimit"), False, False, "bwrap missing (test)")


def test_detect_reports_a_level():
    report = detect_isolation()
    assert report.level in ("bwrap+seccomp", "bwrap", "none") and report.detail
    assert detect_isolation() is report  # probed once per process


def test_missing_bwrap_is_reported():
    report = detect_isolation.__wrapped__("no-such-bwrap-binary")
    assert report.level == "none" and "not found" in report.detail


def test_refuses_without_isolation():
    with pytest.raises(RuntimeError, match="refusing to run untrusted code"):
        require_isolation(NONE, allow_unisolated=False)
    with pytest.raises(RuntimeError, match="refusing"):
        Sandbox(SandboxConfig(), isolation=NONE)


def test_unisolated_opt_in_warns_and_keeps_limits(caplog):
    with caplog.at_level(logging.WARNING):
        sandbox = Sandbox(SandboxConfig(allow_unisolated=True), isolation=NONE)
    assert "UNISOLATED SANDBOX" in caplog.text
    ok = sandbox.run("import os; print(open('in.txt').read(), os.getcwd().startswith('/tmp'))", files={"in.txt": "hi"})
    assert ok.success and ok.stdout == "hi True\n"
    slow = sandbox.run("import time; time.sleep(30)", limits=SandboxLimits(wall_s=0.5))
    assert slow.timeout and slow.wall_s < 2


def test_seccomp_filter_shape():
    prog = build_filter("x86_64")
    assert prog is not None and len(prog) % 8 == 0
    assert build_filter("sparc") is None
