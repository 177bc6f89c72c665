"""Run monitoring: documented metric names, sinks, live console, guards, rollout store, eval metrics.

The loop uses :class:`Monitor` (one per run, in the controller process); the pieces are importable
on their own for roles and tools (``hetrl.browse`` and ``hetrl.plot`` read what it writes).
"""

from hetrl.monitor.core import Monitor
from hetrl.monitor.guards import Alert, GuardStop

__all__ = ["Alert", "GuardStop", "Monitor"]
