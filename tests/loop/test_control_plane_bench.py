"""bench/control_plane.py: the real orchestrator's step against fake roles, counted at the recipe's full scale."""

import importlib.util
from pathlib import Path


def _bench():
    path = Path(__file__).resolve().parents[2] / "bench" / "control_plane.py"
    spec = importlib.util.spec_from_file_location("control_plane_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_simulated_step_counts_every_message_of_the_full_step():
    """One group a step simulated, scaled to moe_grpo's 256 (2,048 samples); the messages to every engine are
    sent to the plan's 256 engines; the trainer's leader shares each TrainWork with the 1,023 other trainer ranks."""
    bench = _bench()
    run = bench.simulate(128, groups=1, steps=1, images=False, fill_steps=3)
    step = bench.mean_step(run)
    messages = {kind: count for (_, _, kind), (count, _) in step["traffic"].items()}
    assert run["samples"] == 2048
    assert messages["RolloutDone"] == messages["RewardWork"] == messages["RewardDone"] == 2048
    assert messages["RolloutWork"] == 256  # one group per engine
    assert messages["SyncWeights"] == messages["ServingWeights"] == messages["ReleaseMemory"] == 256
    assert messages["TrainWork"] == messages["TrainDone"] == 1
    assert messages[bench.SHARE] == 1023
    # every trainer rank receives the leader's whole TrainWork: the share is that message, re-pickled
    train_work = step["traffic"]["orchestrator", "trainer", "TrainWork"][1]
    assert abs(step["share_bytes"] - train_work) < 0.01 * train_work
