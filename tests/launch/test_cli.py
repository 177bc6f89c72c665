"""launch.py's command line: dry runs for a cluster recipe and the local default, usage errors."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_dry_run_prints_plan_and_hetjob_script(tmp_path):
    proc = run("recipe=moe_grpo", "nodes=128", f"run.output_dir={tmp_path}", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "hetrl plan: moe_grpo on slurm_h100, 128 GPU node(s)" in out
    assert "TP 2 x PP 4 x CP 1 x DP 128 (EP 8)" in out and "256 vLLM engine(s), TP 4" in out
    assert "asleep through each train step" in out  # moe_grpo's engines are colocated
    script = (tmp_path / "moe_grpo" / "job.sbatch").read_text()
    assert script in out  # printed verbatim, not wrapped
    assert script.count("#SBATCH hetjob") == 1
    assert "#SBATCH --partition=gpu" in script and "#SBATCH --partition=cpu" in script
    assert "#SBATCH --nodes=128" in script and "#SBATCH --gpus-per-node=8" in script
    assert "--het-group=0" in script and "--het-group=1" in script and "--mpi=pmi2" in script
    assert f"sbatch {tmp_path / 'moe_grpo' / 'job.sbatch'}" in out
    assert (tmp_path / "moe_grpo" / "config.yaml").exists() and (tmp_path / "moe_grpo" / "plan.json").exists()


def test_dry_run_with_a_judge_shows_the_reward_server_component(tmp_path):
    proc = run(
        "recipe=moe_grpo",
        "nodes=128",
        f"run.output_dir={tmp_path}",
        "reward.functions=[{name: math}, {name: judge, weight: 0.5}]",
        "reward.judge.model=policy",
        "reward.server.replicas=8",
        "reward.server.tensor_parallel=4",
        "reward.server.partition=judge",
        "--dry-run",
    )
    assert proc.returncode == 0, proc.stderr
    assert "reward_server" in proc.stdout and "frozen judge replica(s), TP 4 on 'judge'" in proc.stdout
    script = (tmp_path / "moe_grpo" / "job.sbatch").read_text()
    assert script.count("#SBATCH hetjob") == 2 and "#SBATCH --partition=judge" in script
    assert "--het-group=2" in script and "logs/reward_server-node%n.log" in script


def test_dry_run_of_the_local_default_prints_the_mpiexec_command(tmp_path):
    proc = run("recipe=tiny_grpo", f"run.output_dir={tmp_path}", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "mpiexec" in proc.stdout and "hetrl.launch.worker" in proc.stdout
    assert proc.stdout.count(" : ") == 3  # one MPMD segment per role


def test_usage_errors():
    assert run("--bogus").returncode == 2
    loose = run("tiny_grpo")
    assert loose.returncode == 2 and "expected key=value" in loose.stderr
    impossible = run("recipe=moe_grpo", "trainer.tensor_parallel=3", "--dry-run")
    assert impossible.returncode == 2 and "valid tensor_parallel values" in impossible.stderr
    overlap = run("recipe=tiny_grpo", "eval.num_tasks=64", "--dry-run")  # 64 of its 121 sums: not held out
    assert overlap.returncode == 2 and "set eval.allow_training_overlap=true" in overlap.stderr
    missing = run("status", "/nonexistent/run")
    assert missing.returncode == 2 and "not a run directory" in missing.stderr
