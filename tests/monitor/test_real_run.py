"""The monitoring stack on a real tiny run through ``launch.py`` (MPI roles, vLLM engine, Megatron trainer).

One run is shared by the module: GRPO with the math reward plus a length penalty (a dense reward:
every step has non-zero advantages, so the weights really change and rewards differ between
checkpoints), an entropy bonus (so ``entropy`` is emitted) and the entropy-collapse guard rigged to
``warn`` on every step. It takes minutes on 2 cores: the whole module is slow. The other guards
fire on runs of their own rig in test_guards_real_run.py.
"""

import json
from pathlib import Path

import pytest
from real_rig import GROUP, PROMPTS, STEPS, WARM_STEPS, launch, output, read_alerts, read_metrics, run_cli

from hetrl.monitor import names
from hetrl.monitor.rollout_store import RolloutReader

ENTROPY_RIG = ["monitor.guards.entropy_collapse.min_entropy=100", "monitor.guards.entropy_collapse.patience=1"]
# Loop-level metrics every RL step must carry (documented names, hetrl.monitor.names).
EVERY_STEP = [
    names.REWARD_MEAN,
    names.REWARD_STD,
    "reward/math/mean",
    "reward/length/mean",
    names.RESPONSE_LENGTH_MEAN,
    names.RESPONSE_LENGTH_TRUNCATED_FRAC,
    names.LOSS_POLICY,
    names.GRAD_NORM,
    names.ENTROPY,
    names.time_phase("generate"),
    names.time_phase("train"),
    names.TIME_STEP,
    "staleness/mean",
    "staleness/max",
    names.time_phase("reward"),
    names.time_phase("wait"),
    names.time_phase("weight_sync"),  # a warm-start push precedes step 0
]
pytestmark = [pytest.mark.slow, pytest.mark.mpi, pytest.mark.vllm]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    run_dir, proc = launch(
        tmp_path_factory.mktemp("real"), [*ENTROPY_RIG, "monitor.guards.entropy_collapse.action=warn"]
    )
    assert proc.returncode == 0, output(proc)
    return run_dir


def test_metrics_have_the_documented_names(tiny_run):
    rows = read_metrics(tiny_run)
    assert [r["step"] for r in rows] == list(range(STEPS))
    for row in rows:
        for name in row:
            if name not in ("step", "time"):
                names.check_name(name)  # raises on an undocumented name
        missing = [n for n in EVERY_STEP if n not in row]
        assert not missing, f"step {row['step']} lacks {missing}"
    assert any(r[names.GRAD_NORM] > 0 for r in rows), "a dense reward must give non-zero gradients"


def test_time_breakdown_is_measured(tiny_run):
    """Each phase is a real duration: positive, and the trainer's idle + busy time fits in the step."""
    for row in read_metrics(tiny_run):
        for phase in ("generate", "reward", "train", "weight_sync"):
            assert row[names.time_phase(phase)] > 0, (phase, row)
        assert row[names.time_phase("wait")] >= 0
        assert row[names.time_phase("train")] < row[names.TIME_STEP]
    later = read_metrics(tiny_run)[1:]  # step 0's wait also covers the evals and warm start before it
    assert all(r[names.time_phase("wait")] < r[names.TIME_STEP] for r in later)
    assert names.PERF_MFU not in read_metrics(tiny_run)[0], "perf/mfu is GPU-only"


def test_tensorboard_readable_by_tensorboard(tiny_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tiny_run / "tensorboard"))
    acc.Reload()
    rows = read_metrics(tiny_run)
    for name in (names.REWARD_MEAN, names.ENTROPY, names.GRAD_NORM):
        events = acc.Scalars(name)
        assert [e.step for e in events] == list(range(STEPS))
        assert [e.value for e in events] == pytest.approx([r[name] for r in rows], rel=1e-6)


def test_rollouts_match_what_was_trained(tiny_run):
    summary = json.loads((tiny_run / "summary.json").read_text())
    reader = RolloutReader(tiny_run / "rollouts")
    rows = reader.rows()
    assert len(rows) == summary["samples"]["issued"] - summary["samples"]["dropped"] == STEPS * PROMPTS * GROUP
    assert len({r.sample_id for r in rows}) == len(rows)
    metrics = read_metrics(tiny_run)
    for step in range(STEPS):
        rewards = [r.reward for r in rows if r.step == step]
        assert sum(rewards) / len(rewards) == pytest.approx(metrics[step][names.REWARD_MEAN], abs=1e-9)
    record = reader.records(step=0)[0]
    assert len(record.sample.completion_ids) == len(record.sample.logprobs) == len(record.sample.loss_mask) > 0


def test_inspect_worst(tiny_run):
    proc = run_cli(["-m", "hetrl.browse", str(tiny_run), "--worst", "3"], timeout_s=300)
    assert proc.returncode == 0, proc.stderr
    assert "3 rollouts" in proc.stdout
    as_json = run_cli(["-m", "hetrl.browse", str(tiny_run), "--worst", "3", "--json"], timeout_s=300)
    worst = [json.loads(line)["reward"] for line in as_json.stdout.splitlines() if line.strip()]
    lowest = sorted(r.reward for r in RolloutReader(tiny_run / "rollouts").rows())[:3]
    assert sorted(worst) == pytest.approx(lowest)


def test_plot(tiny_run, tmp_path):
    proc = run_cli(["-m", "hetrl.plot", str(tiny_run), "--out", str(tmp_path)], timeout_s=300)
    assert proc.returncode == 0, proc.stderr
    for panel in ("reward", "length", "entropy"):
        png = tmp_path / f"{panel}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "reward/length/mean" in proc.stdout
    gantt = tmp_path / "timeline.png"
    assert gantt.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and gantt.stat().st_size > 5000
    assert "where a step goes" in proc.stdout


def test_the_timeline_shows_every_phase_and_hop_of_a_step(tiny_run):
    """Each RL step after the first holds the phases of every role and the messages between them."""
    from hetrl.control.timeline import hop_latencies, phase_medians, read_timeline, step_windows

    records = read_timeline(tiny_run)
    assert sorted(step_windows(records)) == list(range(STEPS))
    phases = phase_medians(records)
    for phase in (
        "orchestrator_0: collect batch",
        "orchestrator_0: train",
        "rollout_0: generate",
        "rollout_0: reload weights",
        "reward_0: score",
        "trainer_0: log-probs",
        "trainer_0: forward-backward",
        "trainer_0: optimizer step",
        "trainer_0: push weights",
    ):
        assert phases.get(phase, 0) > 0, (phase, phases)
    assert phases["orchestrator_0: collect batch"] + phases["orchestrator_0: train"] <= phases["orchestrator_0: step"]
    hops = hop_latencies(records)
    for hop in (
        "RolloutWork -> rollout_0",
        "RolloutDone -> orchestrator_0",
        "RewardWork -> reward_0",
        "RewardDone -> orchestrator_0",
        "TrainWork -> trainer_0",
        "TrainDone -> orchestrator_0",
        "SyncWeights -> rollout_0",
    ):
        latency, per_step = hops[hop]
        assert 0 <= latency < 5 and per_step >= 1, (hop, hops[hop])


def test_the_colocated_engine_sleeps_through_every_train_step(tiny_run):
    """tiny_grpo's engine shares the trainer's devices: before each train step (warm start included) it sleeps;
    the step's push wakes its weights, and the KV cache wakes after the push, before it generates again. The
    engine records its transitions on CPU too, where vLLM has no sleep mode: the log says so once."""
    from hetrl.control.timeline import read_timeline

    records = read_timeline(tiny_run)
    engine = [r for r in records if r.who == "rollout_0"]
    turns = [r for r in engine if r.name in ("sleep", "wake weights", "wake kv_cache")]
    steps = [r for r in records if r.who == "trainer_0" and r.name == "make batch"]
    assert len(steps) == WARM_STEPS + STEPS
    assert [r.name for r in turns] == ["sleep", "wake weights", "wake kv_cache"] * len(steps)
    ends = [r.t1 for r in records if r.who == "trainer_0" and r.name == "optimizer step"]
    for index, step in enumerate(steps):
        sleep, wake = turns[3 * index], turns[3 * index + 1]
        step_end = min(t for t in ends if t > step.t0)  # this step's (one update per batch)
        assert sleep.t1 <= step.t0 and step_end <= wake.t0, (index, sleep, step, wake)

    def last_turn(t: float) -> str | None:
        return next((r.name for r in reversed(turns) if r.t1 <= t), None)

    for record in engine:
        if record.name == "receive weights":
            assert last_turn(record.t0) == "wake weights", record
        elif record.name == "generate":
            assert last_turn(record.t0) in (None, "wake kv_cache"), record
    log = (tiny_run / "logs" / "rollout_0.log").read_text()
    assert log.count("vLLM has no sleep mode on CPU") == 1


def test_warn_guard_fires_and_the_run_goes_on(tiny_run):
    alerts = read_alerts(tiny_run)
    entropy = [a for a in alerts if a["guard"] == "entropy_collapse"]
    assert entropy and all(a["action"] == "warn" for a in entropy)
    assert (tiny_run / "summary.json").exists()


def eval_cli(run_dir: Path, checkpoint: Path, out: Path) -> dict:
    proc = run_cli(
        ["launch.py", "eval", f"recipe={run_dir / 'config.yaml'}", f"checkpoint={checkpoint}", "--out", str(out)]
    )
    assert proc.returncode == 0, output(proc)
    assert "mean reward" in proc.stdout
    return json.loads(out.read_text())


def test_standalone_eval_reproduces_the_runs_evals(tiny_run, tmp_path):
    """Same weights, same held-out draw, greedy: the same mean reward as the loop's own eval."""
    summary = json.loads((tiny_run / "summary.json").read_text())
    before = eval_cli(tiny_run, tiny_run / "initial_model", tmp_path / "before.json")
    assert before["kind"] == "hf" and before["num_samples"] == 8
    assert before["mean_reward"] == pytest.approx(summary["eval_before"], abs=1e-9)
    after = eval_cli(tiny_run, tiny_run / "checkpoints", tmp_path / "after.json")
    assert after["kind"] == "trainer" and after["checkpoint"].endswith(f"step_{STEPS + 2:08d}")
    assert after["mean_reward"] == pytest.approx(summary["eval_after"], abs=1e-9)
    assert after["mean_reward"] != pytest.approx(before["mean_reward"], abs=1e-9), (
        "training changed nothing: the comparison proves nothing"
    )
    assert set(after["metrics"]) == {
        "eval/reasoning_gym.basic_arithmetic/pass@1",
        "eval/reasoning_gym.basic_arithmetic/mean@1",
    }
