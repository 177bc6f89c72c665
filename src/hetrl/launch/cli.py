"""``launch.py``'s command line: ``[recipe=NAME] [key=value ...] [--dry-run]`` and run subcommands.

Argument parsing stays here (the app), never in the library: everything below takes typed values.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from hetrl.config.loader import ConfigError, load_config, save_resolved
from hetrl.config.paths import check_paths
from hetrl.config.schema import HetrlConfig
from hetrl.control import rundir
from hetrl.control.plan import Plan, PlanError, make_plan
from hetrl.env.registry import build_held_out_split
from hetrl.launch.display import plan_tables
from hetrl.launch.local import mpiexec_command, run_local
from hetrl.launch.sbatch import write_sbatch
from hetrl.loop.export import CheckpointError, export_run

USAGE = """\
usage: python launch.py [recipe=NAME] [key=value ...] [--dry-run]
       python launch.py status|logs|cancel RUN_DIR
       python launch.py eval [recipe=NAME] checkpoint=PATH [key=value ...] [--out FILE]
       python launch.py export RUN_DIR [step=N] out=DIR
       python launch.py view RUN_DIR [--port N] [--host ADDR]

  recipe=NAME   a recipe under recipes/ (default tiny_grpo) or a path to a YAML file
  key=value     override any recipe key, e.g. nodes=128 trainer.tensor_parallel=4
  --dry-run     print the plan and the job script without running anything
  --check       start every role, handshake over the control plane, exit (checks the job's wiring)

  eval          score a checkpoint (an HF directory, or a run's checkpoints/ or step_N/ directory)
                on the recipe's held-out tasks in this process; writes eval.json into the
                checkpoint directory, or to --out FILE
  export        write a run's policy (its latest checkpoint, or RUN_DIR/checkpoints/step_N) to DIR
                as an HF checkpoint with its tokenizer and chat template, whatever TP/PP layout it
                trained in: transformers and vLLM load DIR as it is
  view          serve a run's overview, metrics, rollouts and timeline to a browser at a printed
                local URL (python -m hetrl.view), live while the run writes them
"""


def main(argv: list[str]) -> int:
    console = Console(stderr=True)
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv and argv[0] in RUN_COMMANDS:
        return run_command(argv[0], argv[1:], console)
    if argv and argv[0] == "eval":
        return eval_command(argv[1:], console)
    if argv and argv[0] == "export":
        return export_command(argv[1:], console)
    if argv and argv[0] == "view":
        # lazy: starlette and uvicorn, which only the viewer needs
        from hetrl.view.__main__ import main as view_main

        return view_main(argv[1:])
    flags = [a for a in argv if a.startswith("--")]
    unknown = [f for f in flags if f not in ("--dry-run", "--check")]
    if unknown:
        console.print(f"[red]error:[/red] unknown option(s) {' '.join(unknown)}\n{USAGE}")
        return 2
    words = [a for a in argv if not a.startswith("--")]
    loose = [w for w in words if "=" not in w]
    if loose:
        console.print(f"[red]error:[/red] expected key=value, got {' '.join(loose)!r}\n{USAGE}")
        return 2
    recipe = next((w.split("=", 1)[1] for w in words if w.startswith("recipe=")), "tiny_grpo")
    overrides = [w for w in words if not w.startswith("recipe=")]
    try:
        cfg, plan = compose_and_plan(recipe, overrides)
    except (ConfigError, PlanError) as err:
        console.print(f"[red]error:[/red] {escape(str(err))}", highlight=False, soft_wrap=True)
        return 2
    run_dir = prepare_run_dir(cfg, plan)
    if "--dry-run" in flags:
        return dry_run(cfg, plan, run_dir, Console())
    return launch(cfg, plan, run_dir, check="--check" in flags)


def compose_and_plan(recipe: str, overrides: list[str]) -> tuple[HetrlConfig, Plan]:
    """Every check a launch or dry run makes on the login node: the recipe composed and validated,
    the files it names present, the layout planned, the eval tasks held out. Raises ConfigError or PlanError."""
    cfg = load_config(recipe, overrides)
    check_extras(cfg)
    check_paths(cfg)
    plan = make_plan(cfg)
    check_held_out(cfg)
    return cfg, plan


def check_extras(cfg: HetrlConfig) -> None:
    """Refuse a recipe whose components need an optional extra this install lacks: on the login node, not
    in the first rank that imports it."""
    if cfg.env.name == "openenv" and importlib.util.find_spec("openenv") is None:
        raise ConfigError(
            "env.name=openenv needs the openenv extra (openenv-core, websockets), which is not installed: "
            "pip install -e '.[openenv]'"
        )


def check_held_out(cfg: HetrlConfig) -> None:
    """Refuse a recipe whose eval tasks training also sees, unless it says so (``eval.allow_training_overlap``):
    a reward reported as held-out must be one. Builds the split the run's orchestrator builds
    (hetrl.env.tasks.split; on 2 cores 0.2 s for tiny_grpo's 2,000 tasks, 1.5 s for gsm_symbolic's 10,000)."""
    report = build_held_out_split(cfg.env, seed=cfg.run.seed, num_eval_tasks=cfg.eval.num_tasks).report
    if report.overlap_fraction and not cfg.eval.allow_training_overlap:
        raise ConfigError(
            f"eval: {report.num_overlap} of the {report.num_held_out} eval tasks (eval.num_tasks) also appear in "
            f"training, and {report.num_shared} of its {report.num_distinct:,} distinct tasks are too many to carve "
            f"out of it (at most {report.max_carvable}): the eval would measure a training-set reward. Hold out fewer "
            f"distinct tasks (eval.num_tasks <= {report.max_carvable}, scored with more samples each: eval.k), widen "
            "env.tasks, or draw them from a disjoint env.eval_tasks; or set eval.allow_training_overlap=true to report "
            "a training-set reward"
        )


def prepare_run_dir(cfg: HetrlConfig, plan: Plan) -> Path:
    """Create the run directory with the resolved config and the plan every rank reads."""
    run_dir = Path(cfg.run.output_dir).resolve() / cfg.run.name
    save_resolved(cfg, run_dir)
    plan.save(run_dir)
    return run_dir


def dry_run(cfg: HetrlConfig, plan: Plan, run_dir: Path, console: Console) -> int:

    for table in plan_tables(cfg, plan):
        console.print(table)
    if cfg.cluster.launcher == "local":
        console.file.flush()
        print("local launch command:\n  " + " ".join(mpiexec_command(cfg, plan, run_dir)))
        return 0

    script = write_sbatch(plan, cfg.cluster, run_dir, job_name=cfg.run.name)
    console.file.flush()
    print(script.read_text(), end="")  # verbatim: a console would wrap long lines
    print(f"# dry run: nothing submitted. To submit by hand:\nsbatch {script}")
    return 0


def launch(cfg: HetrlConfig, plan: Plan, run_dir: Path, check: bool = False) -> int:
    if cfg.cluster.launcher == "local":
        return run_local(cfg, plan, run_dir, check=check)
    from hetrl.launch import slurm  # lazy: submitit (~0.5 s), only for what talks to Slurm

    try:
        job_id = slurm.submit(plan, cfg.cluster, run_dir, job_name=cfg.run.name)
    except slurm.SlurmSubmitError as err:
        Console(stderr=True).print(f"[red]error:[/red] {err}", markup=False, highlight=False)
        return 2
    print(f"submitted job {job_id}; follow it with: python launch.py status {run_dir}")
    return 0


RUN_COMMANDS = ("status", "logs", "cancel")


def eval_command(args: list[str], console: Console) -> int:
    """``eval [recipe=NAME] checkpoint=PATH [key=value ...] [--out FILE]``: see hetrl.loop.evaluate."""
    out, words, rest = None, [], list(args)
    while rest:
        word = rest.pop(0)
        if word == "--out" and rest:
            out = rest.pop(0)
        elif word.startswith("--out="):
            out = word.split("=", 1)[1]
        else:
            words.append(word)
    checkpoint = next((w.split("=", 1)[1] for w in words if w.startswith("checkpoint=")), None)
    loose = [w for w in words if "=" not in w or w.startswith("--")]
    if loose or not checkpoint:
        console.print(
            f"error: eval needs checkpoint=PATH and key=value words, got {' '.join(args)!r}\n{USAGE}", markup=False
        )
        return 2
    recipe = next((w.split("=", 1)[1] for w in words if w.startswith("recipe=")), "tiny_grpo")
    overrides = [w for w in words if not w.startswith(("recipe=", "checkpoint="))]
    # lazy: the env, reward and monitor stacks (~1.8 s), which only `eval` needs
    from hetrl.loop.evaluate import CheckpointError, evaluate_checkpoint

    try:
        report = evaluate_checkpoint(load_config(recipe, overrides), checkpoint, out)
    except (ConfigError, CheckpointError) as err:
        console.print(f"error: {err}", markup=False, highlight=False)
        return 2
    print("\n".join(report.lines()), flush=True)
    return 0


def export_command(args: list[str], console: Console) -> int:
    """``export RUN_DIR [step=N] out=DIR``: see hetrl.loop.export."""
    runs = [a for a in args if "=" not in a]
    values = dict(a.split("=", 1) for a in args if "=" in a)
    unknown = sorted(set(values) - {"step", "out"})
    step = values.get("step")
    if len(runs) != 1 or unknown or not values.get("out") or (step is not None and not step.isdigit()):
        console.print(
            f"error: export needs one RUN_DIR, out=DIR and optionally step=N, got {' '.join(args)!r}\n{USAGE}",
            markup=False,
        )
        return 2

    try:
        out = export_run(runs[0], values["out"], None if step is None else int(step))
    except (ConfigError, CheckpointError) as err:
        console.print(f"error: {err}", markup=False, highlight=False)
        return 2
    print(f"[hetrl] exported the policy of {runs[0]} to {out}", flush=True)
    return 0


def run_command(command: str, args: list[str], console: Console) -> int:
    """``status|logs|cancel RUN_DIR`` for a run submitted to Slurm."""
    from hetrl.launch import slurm  # lazy: submitit (~0.5 s), only for what talks to Slurm

    if len(args) != 1:
        console.print(f"usage: python launch.py {command} RUN_DIR")
        return 2
    run_dir = Path(args[0])
    if not (run_dir / rundir.PLAN).exists():
        console.print(f"[red]error:[/red] {run_dir} is not a run directory (no {rundir.PLAN})", markup=False)
        return 2
    try:
        if command == "status":
            print(slurm.status(run_dir))
        elif command == "logs":
            print(slurm.logs(run_dir))
        else:
            print(slurm.cancel(run_dir))
    except (slurm.SlurmSubmitError, FileNotFoundError, RuntimeError) as err:
        console.print(f"[red]error:[/red] {err}", markup=False, highlight=False)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
