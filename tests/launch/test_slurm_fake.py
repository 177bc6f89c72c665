"""hetrl.launch.slurm against fake sbatch/sacct/squeue/scontrol/scancel/sinfo: no cluster needed.

The fakes record their argv and answer what a Slurm 22.05 cluster answers for a 2-component hetjob.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from hetrl.config import load_config
from hetrl.control.plan import make_plan
from hetrl.launch import slurm

FAKE = textwrap.dedent("""\
    #!{python}
    import json, os, sys
    tool = os.path.basename(sys.argv[0])
    state = json.load(open(os.environ["FAKE_STATE"]))
    with open(os.environ["FAKE_STATE"] + ".calls", "a") as f:
        f.write(json.dumps([tool] + sys.argv[1:]) + "\\n")
    answer = state.get(tool, {{}})
    sys.stdout.write(answer.get("stdout", ""))
    sys.stderr.write(answer.get("stderr", ""))
    sys.exit(answer.get("rc", 0))
    """)
TOOLS = ("sbatch", "sacct", "squeue", "scontrol", "scancel", "sinfo", "srun")
SACCT_RUNNING = (
    "JobID|State|NodeList|ExitCode\n77+0|RUNNING|gpu1|0:0\n77+0.batch|RUNNING|gpu1|0:0\n77+1|RUNNING|cpu1|0:0\n"
)
SACCT_DONE = "JobID|State|NodeList|ExitCode\n77+0|COMPLETED|gpu1|0:0\n77+1|COMPLETED|cpu1|0:0\n"


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).write_text(FAKE.format(python=sys.executable))
        (bin_dir / tool).chmod(0o755)
    state_file = tmp_path / "state.json"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_STATE", str(state_file))

    def answer(**tools: dict) -> None:
        state_file.write_text(json.dumps(tools))

    def calls() -> list[list[str]]:
        path = Path(f"{state_file}.calls")
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    answer(sbatch={"stdout": "Submitted batch job 77\n"})
    return answer, calls


@pytest.fixture
def prepared(tmp_path: Path):
    cfg = load_config("tiny_grpo", ["cluster.launcher=slurm", "cluster.gpus_per_node=2", "cluster.cpus_per_node=8"])
    plan = make_plan(cfg)
    run_dir = tmp_path / 'run "x"\nnewline'
    run_dir.mkdir()
    plan.save(run_dir)
    (run_dir / "config.yaml").write_text("recipe: tiny_grpo\n")
    return plan, cfg.cluster, run_dir


def test_submit_records_the_job_and_passes_chdir(fake, prepared) -> None:
    answer, calls = fake
    plan, cluster, run_dir = prepared
    assert slurm.submit(plan, cluster, run_dir, python="/venv/bin/python") == "77"
    record = json.loads((run_dir / "slurm_job.json").read_text())
    assert record["job_id"] == "77" and record["components"] == 2
    (sbatch,) = [c for c in calls() if c[0] == "sbatch"]
    assert sbatch[1] == f"--chdir={run_dir}"
    submitted = Path(sbatch[2]).read_text()
    assert submitted == (run_dir / "job.sbatch").read_text() and "#SBATCH hetjob" in submitted
    assert (run_dir / "logs").is_dir()


def test_status_prefers_the_live_queue_then_accounting(fake, prepared) -> None:
    answer, calls = fake
    plan, cluster, run_dir = prepared
    slurm.submit(plan, cluster, run_dir)
    # sacct lags: it still says PENDING while slurmctld already runs the job.
    answer(
        sacct={"stdout": SACCT_RUNNING.replace("RUNNING", "PENDING")},
        squeue={"stdout": "77+1|RUNNING|None\n77+0|RUNNING|None\n"},
        scontrol={"stdout": "JobId=77 HetJobId=77 JobState=RUNNING Requeue=1 Restarts=2 BatchFlag=1\n"},
    )
    live = slurm.status(run_dir)
    assert live.state == "RUNNING" and [c.state for c in live.components] == ["RUNNING", "RUNNING"]
    assert live.restarts == 2 and not live.done and live.components[1].nodes == "cpu1"
    answer(sacct={"stdout": SACCT_DONE}, squeue={"stdout": ""})
    final = slurm.status(run_dir)
    assert final.state == "COMPLETED" and final.done
    answer(sacct={"stdout": "JobID|State|NodeList|ExitCode\n77+0|COMPLETED|gpu1|0:0\n"}, squeue={"stdout": ""})
    assert not slurm.status(run_dir).done, "a component sacct has not listed yet is not done"


def test_pending_reason_is_reported(fake, prepared) -> None:
    answer, _ = fake
    plan, cluster, run_dir = prepared
    slurm.submit(plan, cluster, run_dir)
    answer(
        sacct={"stdout": SACCT_RUNNING.replace("RUNNING", "PENDING")},
        squeue={"stdout": "77+0|PENDING|Resources\n77+1|PENDING|Resources\n"},
    )
    pending = slurm.status(run_dir)
    assert pending.state == "PENDING" and pending.reason == "Resources"


@pytest.mark.parametrize(
    ("stderr", "hint"),
    [
        (
            "sbatch: error: invalid partition specified: nope\nsbatch: error: Batch job submission failed: Invalid "
            "partition name specified\n",
            "cluster.gpu_partition",
        ),
        ("sbatch: error: Batch job submission failed: Node count specification invalid\n", "lower nodes="),
        (
            "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified\n",
            "cluster.account",
        ),
        (
            "sbatch: error: Batch job submission failed: Requested time limit is invalid (missing or exceeds some "
            "limit)\n",
            "cluster.time_limit",
        ),
    ],
)
def test_sbatch_refusals_become_clear_errors(fake, prepared, stderr: str, hint: str) -> None:
    answer, _ = fake
    plan, cluster, run_dir = prepared
    answer(sbatch={"stderr": stderr, "rc": 1}, sinfo={"stdout": "gpu* 4 gpu:2\ncpu 4 (null)\n"})
    with pytest.raises(slurm.SlurmSubmitError) as err:
        slurm.submit(plan, cluster, run_dir)
    message = str(err.value)
    assert message.startswith("Slurm rejected the job: ") and hint in message
    assert stderr.splitlines()[-1].split("failed: ")[-1] in message
    assert not (run_dir / "slurm_job.json").exists()


def test_a_job_that_can_never_start_is_cancelled_and_explained(fake, prepared) -> None:
    answer, calls = fake
    plan, cluster, run_dir = prepared
    answer(
        sbatch={"stdout": "Submitted batch job 77\n"},
        squeue={"stdout": "77+0|PENDING|PartitionNodeLimit\n"},
        sinfo={"stdout": "gpu* 4 gpu:2\n"},
    )
    with pytest.raises(slurm.SlurmSubmitError, match="(?s)PartitionNodeLimit.*lower nodes="):
        slurm.submit(plan, cluster, run_dir)
    assert ["scancel", "77"] in calls()


def test_cancel_logs_and_unsubmitted_run_dirs(fake, prepared, tmp_path: Path) -> None:
    answer, calls = fake
    plan, cluster, run_dir = prepared
    with pytest.raises(FileNotFoundError, match="never submitted"):
        slurm.status(run_dir)
    slurm.submit(plan, cluster, run_dir)
    assert slurm.logs(run_dir).startswith("no logs yet")
    (run_dir / "slurm-77.out").write_text("hetrl: job 77\n")
    (run_dir / "logs" / "train-node0.log").write_text("\n".join(f"line {i}" for i in range(10)))
    text = slurm.logs(run_dir, tail_lines=2)
    assert text.index("slurm-77.out") < text.index("train-node0.log")
    assert "line 9" in text and "line 7" not in text
    assert slurm.cancel(run_dir) == "77" and ["scancel", "77"] in calls()
    answer(scancel={"stderr": "scancel: error: Invalid job id specified\n", "rc": 1})
    with pytest.raises(RuntimeError, match="Invalid job id"):
        slurm.cancel(run_dir)


def test_missing_run_files_and_tools(fake, prepared, monkeypatch: pytest.MonkeyPatch) -> None:
    plan, cluster, run_dir = prepared
    (run_dir / "plan.json").unlink()
    with pytest.raises(FileNotFoundError, match="plan.json is missing"):
        slurm.submit(plan, cluster, run_dir)
    monkeypatch.setenv("PATH", "/nonexistent")
    plan.save(run_dir)
    with pytest.raises(RuntimeError, match="sbatch not found"):
        slurm.submit(plan, cluster, run_dir)
