"""Sandboxed execution of untrusted (policy-written) programs; see sandbox.py for the contract."""

from hetrl.sandbox.isolation import IsolationReport, detect_isolation, require_isolation
from hetrl.sandbox.pool import SandboxPool
from hetrl.sandbox.sandbox import CHANNEL_ENV, ExecutionResult, Sandbox

__all__ = [
    "CHANNEL_ENV",
    "ExecutionResult",
    "IsolationReport",
    "Sandbox",
    "SandboxPool",
    "detect_isolation",
    "require_isolation",
]
