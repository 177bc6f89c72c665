"""The rendered sbatch script, checked structurally and by running it under a fake srun/scontrol.

No Slurm needed: the script is parsed (directives per het component, the srun het step) and then
executed by bash with `srun` and `scontrol` replaced by recorders, in run directories whose names
hold quotes, spaces, `$(...)` and newlines.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hetrl.config import load_config
from hetrl.config.cluster import ClusterConfig
from hetrl.control import rundir
from hetrl.control.plan import Component, make_plan
from hetrl.control.rundir import REQUEUE_EXIT_CODE
from hetrl.launch.sbatch import (
    BLOCKS,
    COLOCATED_TEMPLATE,
    HETJOB_TEMPLATE,
    fill_template,
    render_sbatch,
    write_sbatch,
)

HOSTILE_NAMES = ["with space", "q'uote\"s", "$(touch pwned)`id`", "new\nline", "tab\there;&|<>*"]
LAYOUTS = {  # nodes -> (recipe, overrides)
    1: ("dense_grpo", ["rollout.placement=colocated", "nodes=1"]),
    8: ("dense_grpo", ["nodes=8"]),
    128: ("moe_grpo", ["nodes=128"]),
    1024: (
        "moe_grpo",
        ["nodes=1024", "cluster.account=proj", "cluster.qos=high", "cluster.constraint=h100", "cluster.reservation=rl"],
    ),
}


def parse_script(text: str) -> tuple[dict[str, str], list[dict[str, str]], list[str]]:
    """(job-wide directives, one dict of directives per het component, srun het-step words)."""
    directives = [line[len("#SBATCH ") :] for line in text.splitlines() if line.startswith("#SBATCH ")]
    groups: list[dict[str, str]] = [{}]
    for directive in directives:
        if directive == "hetjob":
            groups.append({})
            continue
        (word,) = shlex.split(directive)
        key, _, value = word.removeprefix("--").partition("=")
        groups[-1][key] = value
    job_keys = ("job-name", "chdir", "output", "open-mode", "requeue", "no-requeue", "signal")
    job = {k: groups[0].pop(k) for k in job_keys if k in groups[0]}
    launch = text[text.index("# >>> hetrl:launch") : text.index("# <<< hetrl:launch")]
    srun_words = shlex.split(launch.split("\n", 1)[1].replace("\\\n", " "))
    assert srun_words[0] == "srun" and srun_words[-1] == "&"
    return job, groups, srun_words[:-1]


def het_commands(srun_words: list[str]) -> list[list[str]]:
    """Split the srun MPMD line at ':' into per-component word lists (first holds the common options)."""
    parts, current = [], []
    for word in srun_words[1:]:
        if word == ":":
            parts.append(current)
            current = []
        else:
            current.append(word)
    parts.append(current)
    first = parts[0]
    start = next((i for i, w in enumerate(first) if w.startswith("--het-group=")), 4)  # 4 common options
    parts[0] = first[start:]
    return parts


@pytest.mark.parametrize("nodes", sorted(LAYOUTS))
def test_components_match_the_plan(nodes: int, tmp_path: Path) -> None:
    recipe, overrides = LAYOUTS[nodes]
    cfg = load_config(recipe, overrides)
    plan = make_plan(cfg)
    text = render_sbatch(plan, cfg.cluster, str(tmp_path), python="/venv/bin/python")
    assert "\nPYTHON=/venv/bin/python\n" in text
    job, groups, srun = parse_script(text)
    assert len(groups) == len(plan.components) >= 2
    assert job["chdir"] == str(tmp_path) and "requeue" in job
    assert job["signal"] == f"B:USR1@{cfg.cluster.signal_grace_s}"
    for group, component in zip(groups, plan.components):
        assert group["partition"] == component.partition
        assert int(group["nodes"]) == component.nodes
        assert int(group["ntasks-per-node"]) == component.tasks_per_node
        assert int(group.get("gpus-per-node", 0)) == component.gpus_per_node
        assert group["time"] == cfg.cluster.time_limit
        for key in ("account", "qos", "reservation"):
            assert group.get(key) == getattr(cfg.cluster, key)
        assert group.get("constraint") == (cfg.cluster.constraint if component.gpus_per_node else None)
    assert sum(c.nodes for c in plan.components if c.gpus_per_node) == nodes
    assert srun[:5] == ["srun", "--mpi=pmi2", "--kill-on-bad-exit=1", "--label", "--open-mode=append"]
    commands = het_commands(srun)
    assert [c[0] for c in commands] == [f"--het-group={i}" for i in range(len(plan.components))]
    for command, component, group in zip(commands, plan.components, groups):
        worker = command.index("$PYTHON")
        assert command[worker:] == ["$PYTHON", "-m", "hetrl.launch.worker", "--run-dir", "$RUN_DIR"]
        env_words = command[command.index("env") : worker]
        unset = [] if component.gpus_per_node else ["-u", "CUDA_VISIBLE_DEVICES", "-u", "SLURM_JOB_GPUS"]
        threads = str(int(group["cpus-per-task"]))
        assert env_words == ["env", *unset, f"OMP_NUM_THREADS={threads}", f"HETRL_THREADS={threads}"], (
            "only GPU-less components drop the GPU env leaked from component 0; every rank's threads match its cores"
        )


def test_uneven_component_uses_plane_distribution(tmp_path: Path) -> None:
    cfg = load_config("dense_grpo", ["nodes=8"])
    plan = make_plan(cfg)
    cpu = plan.components[-1]
    assert cpu.total_tasks != cpu.nodes * cpu.tasks_per_node  # the orchestrator's extra task
    _, _, srun = parse_script(render_sbatch(plan, cfg.cluster, str(tmp_path)))
    command = het_commands(srun)[-1]
    assert f"--ntasks={cpu.total_tasks}" in command
    assert f"--distribution=plane={cpu.plane_block}" in command and cpu.plane_block == cpu.tasks_per_node - 1
    for other in het_commands(srun)[:-1]:
        assert not any(w.startswith("--ntasks") for w in other)


def test_single_component_uses_the_colocated_template(tmp_path: Path) -> None:
    plan = make_plan(load_config("tiny_grpo"))
    cluster = ClusterConfig(gpus_per_node=0)
    text = render_sbatch(plan, cluster, str(tmp_path))
    assert "#SBATCH hetjob" not in text and "--het-group" not in text
    assert text.startswith(COLOCATED_TEMPLATE.read_text().split("# >>> hetrl:", 1)[0])


@pytest.mark.parametrize("template", [HETJOB_TEMPLATE, COLOCATED_TEMPLATE], ids=lambda p: p.name)
def test_rendering_keeps_the_template_outside_its_blocks(template: Path, tmp_path: Path) -> None:
    cfg = load_config(
        "dense_grpo", ["nodes=8"] if template == HETJOB_TEMPLATE else ["nodes=1", "rollout.placement=colocated"]
    )
    plan = make_plan(cfg)
    if template == COLOCATED_TEMPLATE:
        plan = type(plan)(**{**plan.__dict__, "components": plan.components[:1]})
    rendered = render_sbatch(plan, cfg.cluster, str(tmp_path))
    strip = re.compile(r"# >>> hetrl:(\w+)\n.*?# <<< hetrl:\1\n", re.DOTALL)
    assert strip.sub(r"[\1]", rendered) == strip.sub(r"[\1]", template.read_text())
    assert f"\nREQUEUE_EXIT_CODE={REQUEUE_EXIT_CODE}\n" in template.read_text()
    for name in (rundir.PLAN, rundir.CONFIG, f"{rundir.HANG}/{rundir.REQUEUE_AFTER_HANG}"):  # the run-dir contract
        assert f"-f {name} " in template.read_text(), name
    assert re.findall(r"^# >>> hetrl:(\w+)$", template.read_text(), re.MULTILINE) == list(BLOCKS)


def test_templates_are_valid_bash() -> None:
    for template in (HETJOB_TEMPLATE, COLOCATED_TEMPLATE):
        subprocess.run(["bash", "-n", str(template)], check=True)


def test_fill_template_rejects_missing_blocks() -> None:
    with pytest.raises(ValueError, match="do not match"):
        fill_template("# >>> hetrl:vars\nx\n# <<< hetrl:vars\n", {"vars": "", "launch": ""})


def test_container_wraps_each_component(tmp_path: Path) -> None:
    cfg = load_config(
        "dense_grpo",
        ["nodes=8", "cluster.container=/images/hetrl 1.sif", "cluster.container_binds=[/data, /ckpt:/ckpt:ro]"],
    )
    plan = make_plan(cfg)
    text = render_sbatch(plan, cfg.cluster, str(tmp_path))
    assert "CONTAINER_IMAGE='/images/hetrl 1.sif'" in text
    assert (
        'BATCH_PYTHON=(apptainer exec --bind "$RUN_DIR" --bind /data --bind /ckpt:/ckpt:ro "$CONTAINER_IMAGE" python)'
        in text
    )
    _, _, srun = parse_script(text)
    for command, component in zip(het_commands(srun), plan.components):
        start = command.index("apptainer")
        exec_words = command[start : command.index("$CONTAINER_IMAGE")]
        assert exec_words[:2] == ["apptainer", "exec"]
        assert ("--nv" in exec_words) == bool(component.gpus_per_node)
        assert exec_words[-6:] == ["--bind", "$RUN_DIR", "--bind", "/data", "--bind", "/ckpt:/ckpt:ro"]
        assert command[-5:] == ["$PYTHON", "-m", "hetrl.launch.worker", "--run-dir", "$RUN_DIR"]
    with pytest.raises(ValueError, match="apptainer --bind"):
        render_sbatch(plan, cfg.cluster, str(tmp_path / "a:b"))


def test_user_errors_are_clear(tmp_path: Path) -> None:
    cfg = load_config("dense_grpo", ["nodes=8"])
    plan = make_plan(cfg)
    with pytest.raises(ValueError, match="absolute"):
        render_sbatch(plan, cfg.cluster, "relative/run")
    with pytest.raises(ValueError, match="cannot hold a newline"):
        render_sbatch(plan, cfg.cluster, str(tmp_path), job_name="a\nb")
    bad = type(plan)(**{**plan.__dict__, "components": (Component("a b", "gpu", 1, 1, 0, ("reward",)),)})
    with pytest.raises(ValueError, match="component name"):
        render_sbatch(bad, cfg.cluster, str(tmp_path))


# --- running the script: fake srun and scontrol record what the script asked of Slurm ----------

FAKE_SRUN = textwrap.dedent("""\
    #!{python}
    import json, os, signal, sys, time
    out = os.environ["FAKE_RECORD"]
    def checkpoint_and_exit(*_):
        open(out + ".signal", "w").write("USR1")
        sys.exit({requeue})
    signal.signal(signal.SIGUSR1, checkpoint_and_exit)
    json.dump({{"argv": sys.argv[1:], "cwd": os.getcwd()}}, open(out, "w"))
    mode = os.environ.get("FAKE_SRUN_MODE", "ok")
    if mode == "wait":
        open(out + ".ready", "w").close()
        time.sleep(60)
    if mode in ("hung", "hung_again"):  # what the watchdog leaves when it killed a hung step
        os.makedirs("hang", exist_ok=True)
        if mode == "hung":
            open("hang/requeue", "w").close()
        sys.exit(137)
    sys.exit({{"ok": 0, "requeue": {requeue}, "crash": 1}}.get(mode, 0))
    """)
FAKE_SCONTROL = '#!/bin/sh\necho "$@" >> "$FAKE_RECORD.scontrol"\n'


@pytest.fixture
def fake_slurm(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN.format(python=sys.executable, requeue=REQUEUE_EXIT_CODE))
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_RECORD": str(tmp_path / "record"),
        "SLURM_JOB_ID": "4242",
    }


def _prepared_run_dir(parent: Path, name: str) -> tuple[Path, Path]:
    cfg = load_config("dense_grpo", ["nodes=8"])
    run_dir = parent / name
    (run_dir).mkdir(parents=True)
    (run_dir / "config.yaml").write_text("recipe: dense_grpo\n")
    make_plan(cfg).save(run_dir)
    return run_dir, write_sbatch(make_plan(cfg), cfg.cluster, run_dir, python="/venv/bin/python")


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=repr)
def test_hostile_run_dir_reaches_srun_verbatim(name: str, tmp_path: Path, fake_slurm: dict[str, str]) -> None:
    run_dir, script = _prepared_run_dir(tmp_path, name)
    job, _, _ = parse_script(script.read_text())
    assert job.get("chdir") == (None if "\n" in name else str(run_dir))
    done = subprocess.run(
        ["bash", str(script)], env=fake_slurm, cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(Path(fake_slurm["FAKE_RECORD"]).read_text())
    assert record["cwd"] == str(run_dir)
    run_dirs = [record["argv"][i + 1] for i, w in enumerate(record["argv"]) if w == "--run-dir"]
    assert run_dirs == [str(run_dir)] * 3
    assert not (tmp_path / "pwned").exists() and not (run_dir / "pwned").exists()


def test_script_refuses_an_unprepared_run_dir(tmp_path: Path, fake_slurm: dict[str, str]) -> None:
    run_dir, script = _prepared_run_dir(tmp_path, "run")
    (run_dir / "plan.json").unlink()
    done = subprocess.run(["bash", str(script)], env=fake_slurm, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "no plan.json" in done.stderr
    assert not Path(fake_slurm["FAKE_RECORD"]).exists()


@pytest.mark.parametrize(("mode", "requeued"), [("requeue", True), ("crash", False), ("ok", False)])
def test_requeue_only_on_the_requeue_exit_code(
    mode: str, requeued: bool, tmp_path: Path, fake_slurm: dict[str, str]
) -> None:
    _, script = _prepared_run_dir(tmp_path, "run")
    done = subprocess.run(
        ["bash", str(script)], env={**fake_slurm, "FAKE_SRUN_MODE": mode}, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == {"ok": 0, "requeue": REQUEUE_EXIT_CODE, "crash": 1}[mode]
    scontrol = Path(fake_slurm["FAKE_RECORD"] + ".scontrol")
    assert (scontrol.read_text() == "requeue 4242\n") if requeued else not scontrol.exists()


@pytest.mark.parametrize(("mode", "requeued"), [("hung", True), ("hung_again", False)])
def test_a_hung_step_requeues_while_restarts_are_left(
    mode: str, requeued: bool, tmp_path: Path, fake_slurm: dict[str, str]
) -> None:
    """The watchdog killed the step; it left hang/requeue only if monitor.hang_restarts allows one more."""
    run_dir, script = _prepared_run_dir(tmp_path, "run")
    assert (
        '"${BATCH_PYTHON[@]}" -m hetrl.launch.watchdog --run-dir "$RUN_DIR" --step-pid "$SRUN_PID" &'
        in script.read_text()
    )
    done = subprocess.run(
        ["bash", str(script)], env={**fake_slurm, "FAKE_SRUN_MODE": mode}, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 137
    scontrol = Path(fake_slurm["FAKE_RECORD"] + ".scontrol")
    assert (scontrol.read_text() == "requeue 4242\n") if requeued else not scontrol.exists()
    assert ("the job hung" in done.stdout) == requeued and not (run_dir / "hang" / "requeue").exists()


def test_usr1_to_the_batch_shell_reaches_the_ranks_and_requeues(tmp_path: Path, fake_slurm: dict[str, str]) -> None:
    _, script = _prepared_run_dir(tmp_path, "run")
    proc = subprocess.Popen(
        ["bash", str(script)], env={**fake_slurm, "FAKE_SRUN_MODE": "wait"}, stdout=subprocess.PIPE, text=True
    )
    ready = Path(fake_slurm["FAKE_RECORD"] + ".ready")
    deadline = time.monotonic() + 20
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "fake srun never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == REQUEUE_EXIT_CODE, out
    assert Path(fake_slurm["FAKE_RECORD"] + ".signal").read_text() == "USR1"
    assert Path(fake_slurm["FAKE_RECORD"] + ".scontrol").read_text() == "requeue 4242\n"
