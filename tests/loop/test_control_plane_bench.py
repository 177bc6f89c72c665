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
    """Two groups a step simulated on one replica (128 nodes: DP 128 x 2 / 256 groups), scaled to moe_grpo's 256
    groups (2,048 samples); the messages to every engine are sent to the plan's 256 engines; the leader shares each
    TrainWork with the 1,023 other trainer ranks, each of the 128 receivers its shard with its replica's 7 others."""
    bench = _bench()
    run = bench.simulate(128, groups=2, steps=1, images=False, fill_steps=3)
    step = bench.mean_step(run)
    messages = {kind: count for (_, _, kind), (count, _) in step["traffic"].items()}
    sizes = {kind: num_bytes for (_, _, kind), (_, num_bytes) in step["traffic"].items()}
    assert run["samples"] == 2048
    assert messages["RolloutDone"] == messages["RewardWork"] == messages["RewardDone"] == 2048
    assert messages["RolloutWork"] == messages["ShipSamples"] == 256  # one group per engine, shipped at once
    assert messages["SyncWeights"] == messages["ServingWeights"] == messages["ReleaseMemory"] == 256
    assert messages["TrainWork"] == messages["TrainDone"] == 1
    assert messages[bench.SHARE_WORK] == 1023
    assert messages[bench.SHARE_SHARD] == 128 * 7
    assert "DropSamples" not in messages
    batch = step["batch_bytes"]
    # every sample travels to the trainer once, from its engine; the reward ranks get no routing arrays
    assert abs(sizes["TrainShard"] - batch) < 0.001 * batch
    assert sizes["RewardWork"] < 0.02 * batch
    # the orchestrator moves metadata alone
    assert sum(bench.orchestrator_bytes(step["traffic"])) < bench.GOAL_RATIO * batch
    # a trainer rank receives its replica's samples once and the step's metadata, never the whole batch
    assert abs(step["trainer_ratio"] - (1 + step["header"] / step["shard"])) < 0.01
