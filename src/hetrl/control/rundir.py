"""The run directory's layout and the requeue protocol, in one place.

The run directory is the contract between three parties that share nothing else: the login-node
launcher (``launch.py``) writes the plan and the resolved config into it before anything is
submitted; the Slurm batch script (``slurm/*.sbatch``) checks them, and decides from an exit code
and a file whether to requeue the job; the ranks read the plan and config, and write checkpoints,
logs, liveness records and the run's summary into it. The batch scripts spell the shell side of
the same names (``plan.json``, ``config.yaml``, ``hang/requeue``, ``REQUEUE_EXIT_CODE=3``);
tests/launch/test_sbatch.py checks that they agree. ``config.yaml`` is also written by
:func:`hetrl.config.save_resolved`, which sits below this package.
"""

from __future__ import annotations

from pathlib import Path

PLAN = "plan.json"  # hetrl.control.plan.Plan, written by the launcher
CONFIG = "config.yaml"  # the resolved config, written by the launcher
HANDSHAKE = "handshake.json"  # the orchestrator's record of the wiring check
SUMMARY = "summary.json"  # written by the orchestrator once the run finished
INITIAL_MODEL = "initial_model"  # the random-init HF checkpoint, when the recipe names none
WEIGHTS = "weights"  # the filesystem weight-sync transport's staging directory
LOGS = "logs"  # one log file per rank
CHECKPOINTS = "checkpoints"  # step_<version>/ subdirectories
HANG = "hang"  # liveness beats, stack dumps and the watchdog's report
TIMELINE = "timeline"  # every rank's spans of work and message hops (hetrl.control.timeline)

# The requeue protocol. A rank that checkpointed on a pre-emption signal exits with this code; the
# batch script then requeues the job, which resumes from the checkpoint.
REQUEUE_EXIT_CODE = 3
# Written into the run directory by the orchestrator when it stopped at a checkpoint for a requeue:
# the local launcher's proof of a pre-emption, whatever exit code mpiexec reports for the job.
REQUEUE_MARKER = "requeue-requested"
# In hang/: written by the watchdog when a hung job may be requeued (the batch script requeues and removes it).
REQUEUE_AFTER_HANG = "requeue"


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def hang_dir(run_dir: Path) -> Path:
    return Path(run_dir) / HANG
