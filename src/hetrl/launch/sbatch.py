"""Render the sbatch script of a plan: the templates in ``slurm/`` filled from a Plan and a cluster profile.

Contract:
  * The templates ``slurm/hetjob.sbatch`` (several components, ``#SBATCH hetjob`` between them) and
    ``slurm/colocated.sbatch`` (one component) are real scripts a user can ``sbatch`` by hand. The
    renderer rewrites only their marked blocks (``# >>> hetrl:NAME`` .. ``# <<< hetrl:NAME``:
    ``directives``, ``vars``, ``launch``) and keeps the rest verbatim, so the script a user reads
    in ``--dry-run`` is the template they can edit.
  * The keys that can reach the script are exactly :func:`render_sbatch`'s arguments: the plan,
    the (strict, pydantic) :class:`ClusterConfig` and the keyword-only options. There is no
    free-form "extra sbatch flags" escape hatch. Every value is shell-quoted.
  * One ``srun`` het step launches ``python -m hetrl.launch.worker --run-dir RUN_DIR`` in every
    component (one MPI world, ``--mpi=pmi2``), with a per-component environment: Slurm copies
    the batch shell's (component 0's) ``CUDA_VISIBLE_DEVICES`` into every component, so components
    without GPUs unset it.
  * Ranks checkpoint on SIGUSR1/SIGTERM and exit :data:`hetrl.control.rundir.REQUEUE_EXIT_CODE`;
    the script then requeues the job (``scontrol requeue``), which resumes from the checkpoint.
  * The liveness watchdog (:mod:`hetrl.launch.watchdog`) runs beside ``srun`` on the batch host; a
    hung step is killed, and requeued like a pre-emption up to ``monitor.hang_restarts`` times.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

from hetrl.config.cluster import ClusterConfig
from hetrl.control.plan import Component, Plan

TEMPLATES_DIR = Path(__file__).resolve().parents[3] / "slurm"
HETJOB_TEMPLATE = TEMPLATES_DIR / "hetjob.sbatch"
COLOCATED_TEMPLATE = TEMPLATES_DIR / "colocated.sbatch"
SCRIPT_NAME = "job.sbatch"
WORKER_MODULE = "hetrl.launch.worker"
# Environment a component without GPUs must not inherit from component 0 (Slurm copies the batch
# shell's environment into every het component; only components with gres get it overwritten).
GPU_ENV_LEAKS = ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS")
# Per-rank thread counts, set per component in the srun step (the worker pins torch to HETRL_THREADS).
THREAD_ENV = ("OMP_NUM_THREADS", "HETRL_THREADS")
BLOCKS = ("directives", "vars", "launch")
_BLOCK_RE = re.compile(r"^# >>> hetrl:(\w+)\n.*?^# <<< hetrl:\1\n", re.MULTILINE | re.DOTALL)
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


def render_sbatch(
    plan: Plan,
    cluster: ClusterConfig,
    run_dir: str | os.PathLike[str],
    *,
    job_name: str = "hetrl",
    python: str = sys.executable,
) -> str:
    """The sbatch script text that runs ``plan`` as one Slurm job from ``run_dir``.

    ``run_dir`` must be absolute (the script runs on another machine); it holds config.yaml,
    plan.json, ``slurm-<jobid>.out`` and ``logs/<component>-node<N>.log``. ``python`` is the
    interpreter that has hetrl installed on the compute nodes (ignored inside a container, whose
    ``python`` is used). Raises ValueError for anything the script could not express safely.
    """
    run_dir = os.fspath(run_dir)
    if not os.path.isabs(run_dir):
        raise ValueError(f"run_dir={run_dir!r} must be an absolute path: the job runs on other nodes")
    if not plan.components:
        raise ValueError("the plan has no components: nothing to submit")
    for component in plan.components:
        if not _NAME_RE.match(component.name):
            raise ValueError(f"component name {component.name!r} must match {_NAME_RE.pattern} (it names log files)")
    template_path = HETJOB_TEMPLATE if len(plan.components) > 1 else COLOCATED_TEMPLATE
    blocks = {
        "directives": _directives(plan.components, cluster, run_dir, job_name),
        "vars": _vars(cluster, run_dir, python),
        "launch": _launch(plan.components, cluster),
    }
    return fill_template(template_path.read_text(), blocks)


def write_sbatch(plan: Plan, cluster: ClusterConfig, run_dir: str | os.PathLike[str], **options: str) -> Path:
    """Render into ``run_dir/job.sbatch`` (what ``--dry-run`` shows and :mod:`slurm` submits)."""
    path = Path(run_dir) / SCRIPT_NAME
    path.write_text(render_sbatch(plan, cluster, run_dir, **options))
    return path


def fill_template(template: str, blocks: dict[str, str]) -> str:
    """Replace each marked block's body; the template must carry exactly the blocks given."""
    found = _BLOCK_RE.findall(template)
    if sorted(found) != sorted(blocks):
        raise ValueError(f"template blocks {found} do not match the expected {sorted(blocks)}")

    def body(match: re.Match[str]) -> str:
        name = match.group(1)
        return f"# >>> hetrl:{name}\n{blocks[name].rstrip(chr(10))}\n# <<< hetrl:{name}\n"

    return _BLOCK_RE.sub(body, template)


def _directive(flag: str, value: str | int | None = None) -> str:
    """One ``#SBATCH`` line. sbatch parses shell quotes in directives, but a directive is one line."""
    if value is None:
        return f"#SBATCH --{flag}"
    text = str(value)
    if "\n" in text or "\r" in text:
        raise ValueError(f"--{flag}={text!r}: a #SBATCH directive cannot hold a newline")
    return f"#SBATCH --{flag}={shlex.quote(text)}"


def _directives(components: tuple[Component, ...], cluster: ClusterConfig, run_dir: str, job_name: str) -> str:
    """Job-wide options first, then one block per component separated by ``#SBATCH hetjob``."""
    lines = [_directive("job-name", job_name)]
    if "\n" in run_dir or "\r" in run_dir:
        # Not expressible in a directive; the body cd's there and hetrl.launch.slurm passes --chdir.
        lines.append("# (run dir holds a newline: no --chdir directive; submit from inside the run dir)")
    else:
        lines.append(_directive("chdir", run_dir))
    lines += [
        _directive("output", "slurm-%j.out"),
        _directive("open-mode", "append"),  # a requeued job appends to the same log
        _directive("requeue" if cluster.requeue else "no-requeue"),
        _directive("signal", f"B:USR1@{cluster.signal_grace_s}"),
    ]
    for index, component in enumerate(components):
        if index:
            lines.append("#SBATCH hetjob")
        lines += _component_directives(component, cluster)
    return "\n".join(lines)


def _component_directives(component: Component, cluster: ClusterConfig) -> list[str]:
    """Account/QoS/time/reservation on every component (each hetjob component is its own job record)."""
    total = component.total_tasks
    lines = [
        f"# component `{component.name}`: {', '.join(component.roles)}; {component.nodes} node(s), {total} task(s)"
    ]
    lines.append(_directive("time", cluster.time_limit))
    for flag, value in (("account", cluster.account), ("qos", cluster.qos), ("reservation", cluster.reservation)):
        if value is not None:
            lines.append(_directive(flag, value))
    lines += [
        _directive("partition", component.partition),
        _directive("nodes", component.nodes),
        _directive("ntasks-per-node", component.tasks_per_node),
        _directive("cpus-per-task", cpus_per_task(component, cluster)),
    ]
    if component.gpus_per_node:
        lines.append(_directive("gpus-per-node", component.gpus_per_node))
        lines.append(_directive("exclusive"))
        if cluster.constraint is not None:  # node features (e.g. h100) describe the GPU nodes
            lines.append(_directive("constraint", cluster.constraint))
        if cluster.mem_per_node_gb is not None:
            lines.append(_directive("mem", f"{cluster.mem_per_node_gb}G"))
    return lines


def cpus_per_task(component: Component, cluster: ClusterConfig) -> int:
    """Cores per rank: the node's cores split over its tasks (also each rank's OMP/torch threads)."""
    return max(1, cluster.cpus_per_node // component.tasks_per_node)


def _vars(cluster: ClusterConfig, run_dir: str, python: str) -> str:
    lines = [f"RUN_DIR={shlex.quote(run_dir)}"]
    if cluster.container is None:
        lines += [
            f"PYTHON={shlex.quote(python)}",
            'BATCH_PYTHON=("$PYTHON")  # runs the watchdog on this (the batch) host',
        ]
    else:
        # apptainer --bind specs are comma-separated `src[:dst[:opts]]` lists.
        if "," in run_dir or ":" in run_dir:
            raise ValueError(
                f"run_dir={run_dir!r}: apptainer --bind cannot take a path with ',' or ':'; rename the run dir"
            )
        for bind in cluster.container_binds:
            if "," in bind:
                raise ValueError(f"cluster.container_binds entry {bind!r}: one bind per entry, no ','")
        binds = " ".join(f"--bind {shlex.quote(bind)}" for bind in cluster.container_binds)
        lines += [
            "PYTHON=python  # the image's interpreter",
            f"CONTAINER_IMAGE={shlex.quote(cluster.container)}",
            f'BATCH_PYTHON=(apptainer exec --bind "$RUN_DIR" {binds + " " if binds else ""}"$CONTAINER_IMAGE" python)'
            "  # runs the watchdog on this (the batch) host",
        ]
    return "\n".join(lines)


def _launch(components: tuple[Component, ...], cluster: ClusterConfig) -> str:
    """The single srun het step: ``--het-group=i`` per component, colon-separated (MPMD form)."""
    # --open-mode=append: a requeued job's ranks add to the component logs instead of truncating
    # them, so the pre-empted run's last words survive next to the resumed run's.
    head = "srun --mpi=pmi2 --kill-on-bad-exit=1 --label --open-mode=append"
    if len(components) == 1:
        return f"{head} {_component_command(components[0], cluster)} &"
    parts = [f"--het-group={i} {_component_command(c, cluster)}" for i, c in enumerate(components)]
    return head + " \\\n  " + " \\\n  : ".join(parts) + " &"


def _component_command(component: Component, cluster: ClusterConfig) -> str:
    words = [f"--output=logs/{component.name}-node%n.log"]
    if component.total_tasks != component.nodes * component.tasks_per_node:
        # Uneven components (the CPU one's extra orchestrator task): plane keeps the plan's block
        # order, node 0 first, the extra task wrapping to node 0; plain --ntasks would pack tasks by
        # free CPUs instead.
        words += [
            f"--ntasks={component.total_tasks}",
            f"--distribution=plane={component.plane_block or component.tasks_per_node}",
        ]
    # Threads sized to the rank's cores: library defaults take every core of the node per rank,
    # and oversubscribed ranks run 20-40x slower.
    threads = cpus_per_task(component, cluster)
    words.append("env")
    if not component.gpus_per_node:
        words += [f"-u {name}" for name in GPU_ENV_LEAKS]
    words += [f"{name}={threads}" for name in THREAD_ENV]
    if cluster.container is not None:
        words += ["apptainer", "exec"]
        if component.gpus_per_node:
            words.append("--nv")
        words.append('--bind "$RUN_DIR"')
        words += [f"--bind {shlex.quote(bind)}" for bind in cluster.container_binds]
        words.append('"$CONTAINER_IMAGE"')
    words += ['"$PYTHON"', "-m", WORKER_MODULE, '--run-dir "$RUN_DIR"']
    return " ".join(words)
