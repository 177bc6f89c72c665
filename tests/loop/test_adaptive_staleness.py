"""schedule.adaptive_staleness: the control rule on a scripted metric sequence, its config
refusals, and the orchestrator holding a lowered bound (groups generated beyond it are dropped
and counted, not lost), all without processes; then a rigged run end to end through ``launch.py``.

The rig (:func:`test_the_bound_follows_a_rigged_mismatch`): an async run, bound ceiling 3 and
floor 1, from the shared warm-started model. ``trainer:0:drift_weights@5`` adds noise to the
trainer's weights after its pushes 5 to 7, which the engines never receive, so steps 5 to 7 (and
step 8's samples from v7) are trained with trainer log-probs far from the engine's:
``mismatch/k3_kl`` ~1 nat/token against a target of 0.1. A learning rate of 1e-5 keeps the
mismatch that policy lag itself causes far below the target otherwise (~1e-5; at tiny_grpo's 5e-4
it reaches ~0.02-0.1 at lag 3 once the drift has wrecked the policy), so which side of the target
a step falls on is the rig's doing, not chance's. The bound must stay at the ceiling while the
mismatch is low, fall to the floor on the first drifted step, hold there while the drift lasts,
and climb back (patience 2) once it is over; and it must be, at every step, exactly what the rule
makes of the logged metric.
"""

import json
import math
from types import SimpleNamespace

import pytest

from hetrl.config.loader import ConfigError, load_config
from hetrl.config.loop import ScheduleConfig
from hetrl.control.protocol import RolloutWork
from hetrl.loop import faults
from hetrl.loop.orchestrator import Orchestrator
from hetrl.loop.staleness import AdaptiveBound, build_adaptive_bound, fixed_bound, look_ahead
from hetrl.monitor import names
from hetrl.monitor.sinks import read_jsonl
from hetrl.records import Sample
from tests.loop.orchestrator_rig import bare_orchestrator, finish

ENGINE, REWARD = 1, 2


def _adaptive(**overrides) -> ScheduleConfig:
    keys = {"enabled": True, "target": 1.0, "min_staleness": 1, "grow_below": 0.5, "patience": 2, **overrides}
    return ScheduleConfig(type="async", max_staleness=8, adaptive_staleness=keys)


def test_the_rule_on_a_scripted_sequence():
    """Target 1, calm at <= 0.5, patience 2, between floor 1 and ceiling 8; each row: the step's
    metric, then the bound the next step is held to."""
    rule = build_adaptive_bound(_adaptive())
    script = [
        (0.1, 8),
        (0.2, 8),  # calm at the ceiling: it cannot grow further
        (2.0, 4),  # over the target: halved
        (0.7, 4),  # in the band (0.5, 1]: held, the calm count reset
        (0.4, 4),
        (0.7, 4),
        (0.4, 4),  # a band step broke the run of calm ones
        (0.4, 5),  # two calm steps in a row: one more
        (1.0, 5),  # the target itself is not over it
        (math.nan, 2),  # a non-finite mismatch counts as over the target
        (3.0, 1),
        (5.0, 1),  # halved down to the floor, and no lower
        (None, 1),
        (0.1, 1),
        (None, 1),
        (0.5, 2),  # a step without the metric holds the bound and the count
        (0.0, 2),
        (0.0, 3),
    ]
    assert rule.bound == 8  # it starts at the ceiling
    assert [(value, rule.update(value)) for value, _ in script] == script


def test_the_bound_can_reach_a_floor_of_zero_and_leave_it():
    rule = AdaptiveBound("mismatch/k3_kl", target=0.01, floor=0, ceiling=2, patience=1)
    assert [rule.update(v) for v in (1.0, 1.0, 0.0, 0.0, 0.0)] == [1, 0, 1, 2, 2]


def test_observe_reads_the_configured_metric_and_state_round_trips():
    rule = AdaptiveBound(names.IS_TRUNCATED_FRAC, target=0.05, floor=1, ceiling=4, patience=3)
    assert rule.observe({names.MISMATCH_K3_KL: 9.0}) == 4  # another metric: not this rule's
    assert rule.observe({names.IS_TRUNCATED_FRAC: 0.2}) == 2
    rule.observe({names.IS_TRUNCATED_FRAC: 0.0})
    again = AdaptiveBound(names.IS_TRUNCATED_FRAC, target=0.05, floor=1, ceiling=4, patience=3)
    again.load_state_dict(rule.state_dict())
    assert (again.bound, again.calm_steps) == (2, 1)
    narrower = AdaptiveBound(names.IS_TRUNCATED_FRAC, target=0.05, floor=3, ceiling=4)
    narrower.load_state_dict(rule.state_dict())  # a resume with other limits: clamped into them
    assert narrower.bound == 3


def test_fixed_bounds_and_look_ahead():
    for kind, bound, ahead in [("sync", 0, 0), ("one_step_off", 2, 1), ("async", 2, 2)]:
        schedule = ScheduleConfig(type=kind, max_staleness=2)
        assert (fixed_bound(schedule), look_ahead(schedule, fixed_bound(schedule))) == (bound, ahead)
        assert build_adaptive_bound(schedule) is None
    assert look_ahead(ScheduleConfig(type="async", max_staleness=4), 1) == 1  # async looks ahead as far as its bound


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["schedule.type=one_step_off"],
            "adaptive_staleness.enabled=true needs schedule.type=async .got 'one_step_off'",
        ),
        (
            ["schedule.adaptive_staleness.min_staleness=3"],
            "min_staleness=3 leaves the bound no room below its ceiling schedule.max_staleness=3",
        ),
        (
            ["schedule.adaptive_staleness.metric=is/truncated_frac", "algorithm.is_correction=masked"],
            "metric=is/truncated_frac is measured only with algorithm.is_correction=truncated, but "
            "algorithm.is_correction='masked'",
        ),
        (
            ["schedule.adaptive_staleness.metric=is/masked_frac"],
            "metric=is/masked_frac is measured only with algorithm.is_correction=masked or icepop, but .*'truncated'",
        ),
        (
            ["schedule.adaptive_staleness.metric=is/truncated_frac", "algorithm.is_correction=none"],
            "set algorithm.is_correction=truncated",
        ),
        (["schedule.adaptive_staleness.metric=staleness/max"], "schedule.adaptive_staleness.metric"),
    ],
)
def test_refused_combinations(overrides, message):
    base = ["schedule.type=async", "schedule.max_staleness=3", "schedule.adaptive_staleness.enabled=true"]
    with pytest.raises(ConfigError, match=message):
        load_config("tiny_grpo", [*base, *overrides])


def test_accepted_combinations():
    base = ["schedule.type=async", "schedule.max_staleness=3", "schedule.adaptive_staleness.enabled=true"]
    assert load_config("tiny_grpo", base).schedule.adaptive_staleness.metric == names.MISMATCH_K3_KL
    load_config(
        "tiny_grpo", [*base, "schedule.adaptive_staleness.metric=is/masked_frac", "algorithm.is_correction=masked"]
    )
    load_config("tiny_grpo", [*base, "schedule.adaptive_staleness.metric=is/truncated_frac"])  # truncated: the default
    load_config("tiny_grpo", ["schedule.adaptive_staleness.target=0.5"])  # disabled: its keys are inert


def test_drift_weights_fault_lasts_its_span():
    parsed = faults.Fault.parse("trainer:0:drift_weights@3")
    span = faults.Span(parsed, "trainer", 0, "drift_weights", faults.DRIFT_PUSHES)
    assert [span.fire() for _ in range(8)] == [False, False, True, True, True, False, False, False]
    assert not faults.Span(faults.Fault.parse("trainer:1:drift_weights"), "trainer", 0, "drift_weights", 3).fire()


# ---------------------------------------------------------------- the orchestrator under a lowered bound


class _Stream:
    def __init__(self) -> None:
        self.cursor = 0

    def at(self, cursor: int) -> tuple[str, int]:
        return f"task{cursor}", 100 + cursor

    def next(self) -> tuple[str, int]:
        self.cursor += 1
        return self.at(self.cursor - 1)

    def state_dict(self) -> dict[str, int]:
        return {"cursor": self.cursor}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.cursor = state["cursor"]


def _orchestrator(monkeypatch, schedule: ScheduleConfig, version: int) -> tuple[Orchestrator, list]:
    """An orchestrator without processes (one engine, one reward worker, 1 prompt x 2 samples a step)."""
    cfg = SimpleNamespace(
        run=SimpleNamespace(prompts_per_step=1),
        schedule=schedule,
        algorithm=SimpleNamespace(group_size=2, resolved_dynamic_sampling=False),
        reward=SimpleNamespace(reads_completion_ids=False),
    )
    orch, sent = bare_orchestrator(monkeypatch, cfg, [ENGINE], [REWARD], version)
    orch.stream = _Stream()
    orch.adaptive_bound = build_adaptive_bound(schedule)
    return orch, sent


def _generate_with(orch: Orchestrator, sent: list, versions: list[int]):
    """A pump that completes the next group sent to the engine, sampled by ``versions.pop(0)``."""
    queue: list = []
    seen = 0

    def pump(waiting_for: str, timeout_s: float | None = None) -> None:
        nonlocal seen
        queue.extend(item for message in sent[seen:] if isinstance(message, RolloutWork) for item in message.items)
        seen = len(sent)
        group = [item for item in queue if item.group_id == queue[0].group_id]
        queue[:] = [item for item in queue if item not in group]
        version = versions.pop(0)
        samples = [Sample(i.sample_id, i.group_id, "toy", [1], [7], [1], [0.0], [version]) for i in group]
        finish(orch, ENGINE, REWARD, samples)

    return pump


def test_a_lowered_bound_shrinks_the_look_ahead_and_drops_what_it_outdates(monkeypatch):
    adaptive = {"enabled": True, "target": 0.01, "min_staleness": 1}
    schedule = ScheduleConfig(type="async", max_staleness=3, adaptive_staleness=adaptive)
    orch, sent = _orchestrator(monkeypatch, schedule, version=5)
    assert orch.staleness_bound() == 3 and orch.dispatch_target(3) == 4
    orch.top_up(orch.dispatch_target(orch.staleness_bound()))  # generated under the ceiling: t0..t3
    orch.observe_step({names.MISMATCH_K3_KL: 0.5})  # the mismatch rose: 3 -> 1
    bound = orch.staleness_bound()
    assert bound == 1 and orch.dispatch_target(bound) == 2
    orch.pump = _generate_with(orch, sent, versions=[2, 3, 4, 5])  # t0, t1 are 3 and 2 versions old
    batch, dropped_stale, _ = orch.collect_batch(bound, orch.dispatch_target(bound))
    assert [g[0].group_id for g in batch] == ["t2"] and dropped_stale == 4
    assert orch.stream.cursor == 4, "t3, outstanding, fills the smaller look-ahead: no task drawn for t0 and t1"
    orch.ledger.trained.update(s.sample_id for g in batch for s in g)  # as Orchestrator.train does
    assert orch.ledger_report() == {
        "issued": 8,
        "trained": 2,
        "dropped": 4,
        "in_flight": 2,
        "regenerated": 0,
        "requeued_generation": 0,
        "requeued_reward": 0,
    }
    assert orch.state_dict()["adaptive_bound"] == {"bound": 1, "calm_steps": 0}


def test_a_resumed_orchestrator_restores_the_bound(monkeypatch):
    schedule = ScheduleConfig(type="async", max_staleness=4, adaptive_staleness={"enabled": True, "target": 0.01})
    orch, _ = _orchestrator(monkeypatch, schedule, version=0)
    orch.observe_step({names.MISMATCH_K3_KL: 1.0})
    state = orch.state_dict()
    resumed, _ = _orchestrator(monkeypatch, schedule, version=0)
    resumed.load_state_dict(state)
    assert resumed.staleness_bound() == 2
    older = {key: value for key, value in state.items() if key != "adaptive_bound"}  # saved before the option existed
    fresh, _ = _orchestrator(monkeypatch, schedule, version=0)
    fresh.load_state_dict(older)
    assert fresh.staleness_bound() == 4
    fixed, _ = _orchestrator(monkeypatch, ScheduleConfig(type="async", max_staleness=2), version=0)
    fixed.observe_step({names.MISMATCH_K3_KL: 1.0})  # no adaptive bound: the metrics change nothing
    assert fixed.staleness_bound() == 2 and fixed.state_dict()["adaptive_bound"] is None


# ---------------------------------------------------------------- the rigged run, end to end

STEPS, PROMPTS, GROUP_SIZE = 14, 2, 4
CEILING, FLOOR, TARGET, PATIENCE = 3, 1, 0.1, 2
DRIFT_AT = 5  # the trainer's 5th push follows RL step 4 (no warm start): step 5 is the first one drifted
RIG = [
    f"run.steps={STEPS}",
    f"run.prompts_per_step={PROMPTS}",
    f"algorithm.group_size={GROUP_SIZE}",
    "warm_start.steps=0",
    "eval.num_tasks=1",
    "eval.k=1",
    "checkpoint.every=0",
    "monitor.rollout_store.enabled=false",
    "trainer.lr=1e-5",
    "schedule.type=async",
    f"schedule.max_staleness={CEILING}",
    "schedule.adaptive_staleness.enabled=true",
    f"schedule.adaptive_staleness.target={TARGET}",
    f"schedule.adaptive_staleness.min_staleness={FLOOR}",
    f"schedule.adaptive_staleness.patience={PATIENCE}",
]


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.vllm
def test_the_bound_follows_a_rigged_mismatch(launch, warm_started_model, tmp_path, monkeypatch):
    monkeypatch.setenv(faults.FAULT_ENV, f"trainer:0:drift_weights@{DRIFT_AT}")
    launch(tmp_path, *RIG, f"model.hf_checkpoint={warm_started_model}")
    run_dir = tmp_path / "tiny_grpo"
    steps = read_jsonl(run_dir / "metrics.jsonl")
    assert sorted(steps) == list(range(STEPS))
    bounds = [steps[k][names.STALENESS_BOUND] for k in range(STEPS)]
    k3 = [steps[k][names.MISMATCH_K3_KL] for k in range(STEPS)]
    drifted = range(DRIFT_AT, DRIFT_AT + faults.DRIFT_PUSHES)
    assert max(k3[:DRIFT_AT]) < TARGET * 0.5 and min(k3[k] for k in drifted) > TARGET, f"the rig did not rig: {k3}"
    # The rule, replayed on the logged metric, gives the logged bound of every step.
    rule = AdaptiveBound(names.MISMATCH_K3_KL, TARGET, FLOOR, CEILING, patience=PATIENCE)
    replayed = []
    for value in k3:
        replayed.append(float(rule.bound))
        rule.update(value)
    assert bounds == replayed, (bounds, k3)
    # At the ceiling while calm, at the floor from the first drifted step on, back at the ceiling after it.
    assert bounds[: DRIFT_AT + 1] == [CEILING] * (DRIFT_AT + 1), bounds
    assert bounds[DRIFT_AT + 1 : DRIFT_AT + faults.DRIFT_PUSHES + 1] == [FLOOR] * faults.DRIFT_PUSHES, bounds
    assert bounds[-1] == CEILING, bounds
    # Each batch held to its step's bound; what the lowered bound outdated was dropped and counted.
    assert all(steps[k][names.STALENESS_MAX] <= bounds[k] for k in range(STEPS)), steps
    summary = json.loads((run_dir / "summary.json").read_text())
    samples = summary["samples"]
    assert samples["trained"] == STEPS * PROMPTS * GROUP_SIZE, samples
    assert samples["issued"] == samples["trained"] + samples["dropped"] + samples["in_flight"], samples
    dropped = sum(m[names.STALENESS_DROPPED] for m in steps.values())
    assert dropped == summary["dropped_stale_samples"] == samples["dropped"] > 0, (dropped, summary)
