"""Submit, watch, read and cancel a run's heterogeneous Slurm job, through submitit.

Contract (one run directory = one Slurm job):
  * :func:`submit` renders ``RUN_DIR/job.sbatch`` (:mod:`hetrl.launch.sbatch`), submits it with
    :class:`HetJobExecutor` and records the job id in ``RUN_DIR/slurm_job.json``; ``status``,
    ``logs`` and ``cancel`` find the job from there, so they work from any shell on the login node.
  * submitit has no hetjob support: the executor below reuses its sbatch call, job-id parsing and
    sacct watcher but submits hetrl's own script, and the watcher understands het components
    (sacct reports ``ID+0``, ``ID+1``, ...; plain submitit would only ever see UNKNOWN). submitit's
    bookkeeping folder is ``RUN_DIR/submitit`` (no ``%j``: in a het step ``%j`` is the component's
    id and submitit's IO breaks).
  * Slurm's refusals (unknown partition, a request larger than the partition, bad account/QoS or
    time) raise :class:`SlurmSubmitError` whose message names the recipe key to change.
  * Requeue: ranks that checkpointed on SIGUSR1/SIGTERM exit ``rundir.REQUEUE_EXIT_CODE`` and the
    batch script requeues the job; the job id stays the same, ``status`` shows the restart count.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import FailedJobError
from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

from hetrl.config.cluster import ClusterConfig
from hetrl.control import rundir
from hetrl.control.plan import Plan
from hetrl.launch.sbatch import SCRIPT_NAME, write_sbatch

JOB_FILE = "slurm_job.json"
SUBMITIT_DIR = "submitit"
# sacct states after which the job will not run again (REQUEUED/PREEMPTED are not final).
# squeue reasons of a pending job that can never start as submitted (sites without
# EnforcePartLimits accept such jobs and let them pend forever).
NEVER_STARTS = frozenset(
    {
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "PartitionConfig",
        "BadConstraints",
        "InvalidAccount",
        "InvalidQOS",
        "AssocMaxNodesPerJobLimit",
        "AssocMaxWallDurationPerJobLimit",
        "QOSMaxNodePerJobLimit",
        "QOSMaxWallDurationPerJobLimit",
    }
)
FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE"}
)


class SlurmSubmitError(RuntimeError):
    """Slurm refused the job; the message quotes Slurm and says which recipe key to change."""


@dataclass(frozen=True)
class ComponentStatus:
    index: int
    state: str
    nodes: str
    exit_code: str


@dataclass(frozen=True)
class JobStatus:
    job_id: str
    state: str  # the leader component's state: it runs the batch script, so it is the job's
    restarts: int
    reason: str  # why it is pending ("Resources", "Priority", ...), "" otherwise
    components: tuple[ComponentStatus, ...]
    num_components: int  # as submitted: sacct may list a component late

    def __str__(self) -> str:
        """What ``launch.py status`` prints: the job line, then one line per het component."""
        head = f"job {self.job_id}: {self.state}" + (f" ({self.reason})" if self.reason else "")
        head += f", restarts {self.restarts}" if self.restarts else ""
        lines = [head]
        for c in self.components:
            where = f" on {c.nodes}" if c.nodes and c.nodes != "None assigned" else ""
            code = f", exit code {c.exit_code}" if c.exit_code and c.state.split()[0] in FINAL_STATES else ""
            lines.append(f"  component {c.index}: {c.state}{where}{code}")
        missing = self.num_components - len(self.components)
        lines += [f"  ({missing} component(s) not yet known to Slurm accounting)"] if missing > 0 else []
        return "\n".join(lines)

    @property
    def done(self) -> bool:
        """Final for every submitted component (sacct can lag a component behind the leader)."""
        if len(self.components) < self.num_components:
            return False
        return all(c.state.split()[0] in FINAL_STATES for c in self.components)


class HetSlurmInfoWatcher(SlurmInfoWatcher):
    """submitit's sacct watcher, plus het components: ``ID+k`` rows also answer for ``ID``."""

    def _make_command(self) -> list[str] | None:
        command = super()._make_command()
        if command is None:
            return None
        return [("JobID,State,NodeList,ExitCode" if word == "JobID,State,NodeList" else word) for word in command]

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        info = super().read_info(string)
        for key, stats in list(info.items()):
            leader, plus, offset = key.partition("+")
            if plus and offset == "0":
                info[leader] = stats
        return info

    def components_of(self, job_id: str) -> list[dict[str, str]]:
        """sacct rows of ``job_id``'s het components in order (the job itself if it is not a hetjob)."""
        rows = sorted((k for k in self._info_dict if k.startswith(f"{job_id}+")), key=lambda k: int(k.split("+")[1]))
        return [self._info_dict[k] for k in rows] or ([self._info_dict[job_id]] if job_id in self._info_dict else [])


class HetSlurmJob(SlurmJob):
    watcher = HetSlurmInfoWatcher(delay_s=5)


class HetJobExecutor(submitit.SlurmExecutor):
    """Submits an already rendered heterogeneous sbatch script instead of a pickled function.

    Only :meth:`submit_script` is meant to be called: hetrl's ranks are ``python -m
    hetrl.launch.worker`` processes started by the script's srun het step, not submitit tasks.
    """

    job_class = HetSlurmJob

    def __init__(self, run_dir: str | os.PathLike[str], script_text: str) -> None:
        self.run_dir = Path(run_dir)
        super().__init__(folder=self.run_dir / SUBMITIT_DIR)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._script_text = script_text

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return self._script_text

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        # --chdir on the command line too: a run dir with a newline cannot be a #SBATCH directive.
        return ["sbatch", f"--chdir={self.run_dir}", str(submission_file_path)]

    def _num_tasks(self) -> int:
        return 1  # submitit tracks the job, not per-task result pickles

    def submit_script(self) -> HetSlurmJob:
        try:
            return self._submit_command("")
        except FailedJobError as err:
            raise SlurmSubmitError(explain_sbatch_error(str(err))) from None


def submit(
    plan: Plan,
    cluster: ClusterConfig,
    run_dir: str | os.PathLike[str],
    *,
    job_name: str = "hetrl",
    python: str | None = None,
) -> str:
    """Render ``run_dir/job.sbatch``, submit it, record and return the Slurm job id.

    ``run_dir`` must already hold config.yaml and plan.json (the worker reads them).
    """
    run_dir = Path(run_dir).resolve()
    for name in (rundir.CONFIG, rundir.PLAN):
        if not (run_dir / name).is_file():
            raise FileNotFoundError(
                f"{run_dir / name} is missing: save the resolved config and the plan before submitting"
            )
    _require_tools("sbatch")
    options = {"job_name": job_name} if python is None else {"job_name": job_name, "python": python}
    script = write_sbatch(plan, cluster, run_dir, **options)
    (run_dir / rundir.LOGS).mkdir(exist_ok=True)
    job = HetJobExecutor(run_dir, script.read_text()).submit_script()
    _refuse_if_never_starts(job.job_id)
    record = {
        "job_id": job.job_id,
        "script": SCRIPT_NAME,
        "submitted_at": time.time(),
        "components": len(plan.components),
    }
    (run_dir / JOB_FILE).write_text(json.dumps(record, indent=1))
    return job.job_id


def job_id_of(run_dir: str | os.PathLike[str]) -> str:
    return str(_job_record(run_dir)["job_id"])


def _job_record(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(run_dir) / JOB_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} has no {JOB_FILE}: it was never submitted to Slurm (or not by hetrl)")
    return json.loads(path.read_text())


def status(run_dir: str | os.PathLike[str]) -> JobStatus:
    """The job's state per het component: live from squeue while queued, else from sacct.

    slurmdbd learns of starts asynchronously, so sacct alone says PENDING for a while after the
    ranks run; once the job leaves the queue only accounting knows it (needs slurmdbd).
    """
    _require_tools("sacct", "squeue")
    record = _job_record(run_dir)
    job_id = str(record["job_id"])
    watcher = HetSlurmInfoWatcher(delay_s=0)  # a fresh one: submitit's caches finished jobs forever
    watcher.get_info(job_id, mode="force")
    accounted = watcher.components_of(job_id)
    queued = _queue_states(job_id)
    components = []
    for index in range(max(len(accounted), len(queued))):
        row = accounted[index] if index < len(accounted) else {}
        live = queued.get(index)
        state = live[0] if live else row.get("State", "UNKNOWN")
        components.append(ComponentStatus(index, state, row.get("NodeList", ""), row.get("ExitCode", "")))
    lead_state = components[0].state if components else "UNKNOWN"
    reason = queued[0][1] if 0 in queued and lead_state == "PENDING" else ""
    return JobStatus(job_id, lead_state, _restarts(job_id), reason, tuple(components), int(record["components"]))


def wait(run_dir: str | os.PathLike[str], timeout_s: float, poll_s: float = 1.0) -> JobStatus:
    """Poll :func:`status` until the job reaches a final state; TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        current = status(run_dir)
        if current.done:
            return current
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {current.job_id} still {current.state} after {timeout_s:.0f}s")
        time.sleep(poll_s)


def log_files(run_dir: str | os.PathLike[str]) -> list[Path]:
    """The batch log (``slurm-<id>.out``, appended across requeues) then every ``logs/*`` file."""
    run_dir = Path(run_dir)
    job_id = job_id_of(run_dir)
    batch = [run_dir / f"slurm-{job_id}.out"]
    return [p for p in batch if p.is_file()] + sorted(p for p in (run_dir / rundir.LOGS).glob("*") if p.is_file())


def logs(run_dir: str | os.PathLike[str], *, tail_lines: int | None = 100) -> str:
    """Every log of the run, each under a ``==> path <==`` header, the last ``tail_lines`` lines of each."""
    parts = []
    for path in log_files(run_dir):
        lines = path.read_text(errors="replace").splitlines()
        shown = lines if tail_lines is None else lines[-tail_lines:]
        parts.append(f"==> {path} <==\n" + "\n".join(shown))
    return "\n\n".join(parts) if parts else f"no logs yet in {run_dir} (job {job_id_of(run_dir)})"


def cancel(run_dir: str | os.PathLike[str]) -> str:
    """Cancel the whole job (the leader id covers every het component); returns the job id."""
    _require_tools("scancel")
    job_id = job_id_of(run_dir)
    done = subprocess.run(["scancel", job_id], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"scancel {job_id} failed: {done.stderr.strip() or done.stdout.strip()}")
    return job_id


def explain_sbatch_error(stderr: str) -> str:
    """Slurm's words plus the hetrl key that fixes the problem."""
    slurm_says = " ".join(line.strip() for line in stderr.splitlines() if "error" in line.lower()) or stderr.strip()
    hints = [
        (
            r"invalid partition",
            "check cluster.gpu_partition / cluster.cpu_partition; partitions here: " + _partitions(),
        ),
        (
            r"node configuration is not available|node count specification invalid|more processors requested|too "
            r"many|PartitionNodeLimit|PartitionConfig",
            "the request is larger than the partition: lower nodes= (or cluster.cpu_nodes, cluster.gpus_per_node, "
            "cluster.reward_workers_per_node); partitions here: " + _partitions(),
        ),
        (r"invalid account|account", "check cluster.account (sacctmgr show assoc user=$USER lists yours)"),
        (r"qos", "check cluster.qos (sacctmgr show qos)"),
        (r"time limit", "lower cluster.time_limit below the partition's MaxTime (scontrol show partition)"),
        (r"reservation", "check cluster.reservation (scontrol show reservation)"),
        (r"constraint|feature", "check cluster.constraint against the nodes' features (sinfo -o '%N %f')"),
    ]
    hint = next((text for pattern, text in hints if re.search(pattern, slurm_says, re.IGNORECASE)), "")
    return f"Slurm rejected the job: {slurm_says}" + (f"\n  -> {hint}" if hint else "")


def _partitions() -> str:
    if shutil.which("sinfo") is None:
        return "(sinfo not found)"
    done = subprocess.run(["sinfo", "-h", "-o", "%P %D %G"], capture_output=True, text=True)
    rows = [" ".join(line.split()) for line in done.stdout.splitlines() if line.strip()]
    return (
        "; ".join(f"{r.split()[0]} ({r.split()[1]} nodes, gres {r.split()[2]})" for r in rows if len(r.split()) == 3)
        or "(none)"
    )


def _restarts(job_id: str) -> int:
    """How often the job was requeued (slurmctld knows while the job record lives; sacct does not)."""
    done = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True)
    found = re.search(r"\bRestarts=(\d+)", done.stdout)
    return int(found.group(1)) if found else 0


def _queue_states(job_id: str) -> dict[int, tuple[str, str]]:
    """{component index: (state, pending reason)} from slurmctld; empty once the job left the queue."""
    done = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i|%T|%r"], capture_output=True, text=True)
    states = {}
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        ident, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        leader, _, offset = ident.partition("+")
        if leader == job_id:
            states[int(offset or 0)] = (state, "" if reason == "None" else reason)
    return states


def _refuse_if_never_starts(job_id: str, settle_s: float = 3.0) -> None:
    """Cancel and raise when the scheduler says the job can never start (checked for ``settle_s``)."""
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline:
        state, reason = _queue_states(job_id).get(0, ("", ""))
        if reason in NEVER_STARTS:
            subprocess.run(["scancel", job_id], capture_output=True)
            raise SlurmSubmitError(explain_sbatch_error(f"error: job {job_id} can never start: {reason} (cancelled)"))
        if state != "PENDING" or reason not in ("", "Priority", "Resources"):
            return  # started, finished, or pending for a reason that passes
        time.sleep(0.5)


def _require_tools(*tools: str) -> None:
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        raise RuntimeError(
            f"{', '.join(missing)} not found on PATH: run on a Slurm login node (or start slurm/local/cluster.sh)"
        )


__all__ = [
    "HetJobExecutor",
    "JobStatus",
    "ComponentStatus",
    "SlurmSubmitError",
    "submit",
    "status",
    "wait",
    "logs",
    "log_files",
    "cancel",
    "job_id_of",
    "explain_sbatch_error",
]
