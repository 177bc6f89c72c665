"""The schedule matrix (issue 14): {sync, one_step_off, async} x {colocated, disaggregated} x
{partial rollout on, off}, 6 RL steps each, end to end through ``launch.py``. Every case must

- finish: a hang fails it after LAUNCH_TIMEOUT_S (tests/conftest.py) and leaves no process behind;
- account for every training sample id: issued = trained + dropped + in flight (the orchestrator
  writes no summary.json while an id is unaccounted for), and each step trained a full batch;
- hold the staleness bound: no trained sample is more policy versions behind the trainer than the
  schedule allows (0 for sync, schedule.max_staleness otherwise). The off-policy schedules must
  also have trained on older samples at least once: their generation overlapped training.

Sync runs only with partial rollout off (a run through launch.py costs ~40 s of start-up on 2
cores, and .ci/run has a 90-minute limit): sync generates a whole batch before each step, so no
push or sleep ever interrupts a sample and the setting changes nothing there. The off-policy
schedules run both settings in both placements: an interrupted sample resumes, or is aborted
(disaggregated: a push mid-sample) or started again from its prompt (colocated: a push while it
slept). The push of v8 at which a disaggregated sync run once deadlocked has its own 10-step test.

Every case starts from the shared warm-started model, whose answers earn varied rewards within a
group as in a real run. The workload is the smallest that keeps an engine generating while the
trainer trains: 2 prompts x 4 samples a step, tiny_grpo's 24-token responses (a warm-started
answer takes ~19), one eval task before and after training.
"""

import json

import pytest

from hetrl.monitor import names
from hetrl.monitor.sinks import read_jsonl

STEPS, PROMPTS, GROUP_SIZE = 6, 2, 4
MAX_STALENESS = {"sync": 0, "one_step_off": 1, "async": 2}  # async looks further ahead than one_step_off
WORKLOAD = [
    f"run.steps={STEPS}",
    f"run.prompts_per_step={PROMPTS}",
    f"algorithm.group_size={GROUP_SIZE}",
    "warm_start.steps=0",
    "eval.num_tasks=1",
    "eval.k=1",
    "eval.every=0",
    "checkpoint.every=0",
    "monitor.rollout_store.enabled=false",
]

# The first case also builds the shared warm-started model.
pytestmark = [pytest.mark.slow, pytest.mark.mpi, pytest.mark.vllm, pytest.mark.timeout(1800)]


CASES = [
    ("sync", "colocated", False),
    ("sync", "disaggregated", False),
    *[
        (schedule, placement, partial)
        for schedule in ("one_step_off", "async")
        for placement in ("colocated", "disaggregated")
        for partial in (True, False)
    ],
]


@pytest.mark.parametrize(
    "schedule, placement, partial_rollout",
    CASES,
    ids=[f"{s}-{p}-partial_{'on' if partial else 'off'}" for s, p, partial in CASES],
)
def test_schedule(launch, warm_started_model, tmp_path, schedule, placement, partial_rollout):
    bound = MAX_STALENESS[schedule]
    launch(
        tmp_path,
        *WORKLOAD,
        f"model.hf_checkpoint={warm_started_model}",
        f"schedule.type={schedule}",
        f"schedule.max_staleness={bound}",
        f"rollout.placement={placement}",
        f"rollout.partial_rollout={str(partial_rollout).lower()}",
    )
    run_dir = tmp_path / "tiny_grpo"
    samples = json.loads((run_dir / "summary.json").read_text())["samples"]
    assert samples["trained"] == STEPS * PROMPTS * GROUP_SIZE, samples
    assert samples["issued"] == samples["trained"] + samples["dropped"] + samples["in_flight"], samples
    steps = read_jsonl(run_dir / "metrics.jsonl")
    assert sorted(steps) == list(range(STEPS))
    lags = [metrics[names.STALENESS_MAX] for metrics in steps.values()]
    assert max(lags) <= bound, lags
    if schedule != "sync":
        assert max(lags) >= 1, f"{schedule} never trained on an older sample: generation did not overlap training"


def test_the_disaggregated_sync_run_that_deadlocked_completes(launch, tmp_path):
    """Issue 14's reproduction, as filed: the trainer's 8148-byte result of step 8 held the
    orchestrator inside MPI while the trainer waited in the weight push for engines the orchestrator
    had not yet told to join (tests/control/test_comm.py has the same deadlock in miniature)."""
    launch(
        tmp_path,
        "run.name=sync",
        "run.steps=10",
        "warm_start.steps=0",
        "eval.num_tasks=4",
        "run.prompts_per_step=8",
        "algorithm.group_size=8",
        "rollout.placement=disaggregated",
        "rollout.max_tokens=96",
        "env.max_episode_tokens=200",
        "rollout.partial_rollout=true",
        "run.threads_per_process=1",
        "monitor.rollout_store.enabled=false",
        "checkpoint.every=0",
        "trainer.micro_batch_size=64",
        "schedule.type=sync",
    )
    assert sorted(read_jsonl(tmp_path / "sync" / "metrics.jsonl")) == list(range(10))
