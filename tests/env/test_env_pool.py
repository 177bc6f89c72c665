"""The env worker: groups of concurrent episodes from a resumable stream."""

import asyncio

from env_helpers import user_text

from hetrl.config.env import EnvConfig, TaskSourceConfig
from hetrl.env.pool import EnvWorker
from hetrl.env.registry import build_task_stream, env_factory
from hetrl.env.scripted import ScriptedPolicy
from hetrl.types import SamplingParams

CFG = TaskSourceConfig(source="reasoning_gym", name="basic_arithmetic", size=20)


def make_worker(codec, concurrency):
    return EnvWorker(env_factory(EnvConfig(name="math")), build_task_stream(CFG, seed=1), codec,
                     SamplingParams(max_tokens=64), max_turns=1, max_episode_tokens=512, concurrency=concurrency)


def test_groups_run_concurrently_within_the_limit(codec):
    stream = build_task_stream(CFG, seed=1)
    answers = {}
    for task, _ in stream.take(20):
        answers[task.messages[0]["content"]] = task.answer
    policy = ScriptedPolicy(codec, lambda c: f"<answer>{answers[user_text(c)]}</answer>")
    in_flight, peak = 0, 0

    async def slow_generate(prompt_ids, sampling):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return await policy.generate(prompt_ids, sampling)

    worker = make_worker(codec, concurrency=5)
    groups = asyncio.run(worker.run_groups(num_groups=3, group_size=4, generate=slow_generate))
    assert peak == 5
    assert [[s.sample_id for s in g] for g in groups] == [[f"g{i}-{k}" for k in range(4)] for i in range(3)]
    for group in groups:
        assert len({s.group_id for s in group}) == 1 and len({s.prompt_text for s in group}) == 1
        assert len({s.info["seed"] for s in group}) == 4  # each episode of a group has its own seed
        assert all(s.rewards == {"env": 1.0} for s in group)


def test_worker_resumes_where_it_stopped(codec):
    policy = ScriptedPolicy(codec, lambda c: "<answer>0</answer>", record=False)
    worker = make_worker(codec, concurrency=8)
    asyncio.run(worker.run_groups(2, 2, policy.generate))
    state = worker.state_dict()
    expected = asyncio.run(worker.run_groups(2, 2, policy.generate))
    resumed = make_worker(codec, concurrency=8)
    resumed.load_state_dict(state)
    again = asyncio.run(resumed.run_groups(2, 2, policy.generate))
    assert [[(s.sample_id, s.prompt_ids, s.info["seed"]) for s in g] for g in again] == \
           [[(s.sample_id, s.prompt_ids, s.info["seed"]) for s in g] for g in expected]
