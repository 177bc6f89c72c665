"""Environments served from their own processes give the same episodes as local ones."""

import asyncio
import dataclasses

import pytest
from env_helpers import run_groups, tool_call, tool_turns

from hetrl.config.env import EnvConfig, TaskSourceConfig
from hetrl.env.registry import build_task_stream, env_factory
from hetrl.env.remote import EnvProcessPool
from hetrl.env.scripted import ScriptedPolicy

CFG = EnvConfig(name="tool_math", max_turns=4)
TASKS = TaskSourceConfig(source="reasoning_gym", name="basic_arithmetic", size=10)


def script(conversation):
    turn = tool_turns(conversation)
    return [tool_call("calculator", expression="6 * 7"), "<tool_call>{bad</tool_call>", "<answer>42</answer>"][turn]


def three_groups(make_env, codec):
    policy = ScriptedPolicy(codec, script, record=False)
    return asyncio.run(
        run_groups(
            make_env,
            build_task_stream(TASKS, seed=2),
            codec,
            policy.generate,
            num_groups=3,
            group_size=2,
            max_turns=CFG.max_turns,
            max_episode_tokens=2048,
            concurrency=8,
        )
    )


def test_remote_envs_match_local_ones(codec):
    local = three_groups(env_factory(CFG), codec)
    with EnvProcessPool(CFG, num_servers=2) as pool:
        remote = three_groups(pool.make_env, codec)
        bad = pool.make_env()
        with pytest.raises(RuntimeError, match="step before reset"):
            asyncio.run(bad.step({"role": "assistant", "content": "x"}))
    assert [dataclasses.asdict(s) for s in remote] == [dataclasses.asdict(s) for s in local]
    assert all(s.num_turns == 3 and s.info["num_tool_errors"] == 1 for s in remote)
