"""Helpers shared by the env tests (a plain module: conftest fixtures cannot be imported)."""

import asyncio
import json
import re

from hetrl.env.episodes import EpisodeRunner, group_items
from hetrl.env.runner import run_episode
from hetrl.env.scripted import ScriptedPolicy
from hetrl.records import SamplingParams


def user_text(conversation: str) -> str:
    """The content of the first user turn of a rendered ChatML conversation."""
    return re.search(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", conversation, re.DOTALL).group(1)


def tool_turns(conversation: str) -> int:
    return conversation.count("<|im_start|>tool")


def tool_call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def play(env, task, codec, script, seed=0, max_turns=8, max_episode_tokens=8192, max_tokens=2048):
    """Run one episode of ``env`` on ``task`` with a scripted policy; returns (sample, policy)."""
    policy = ScriptedPolicy(codec, script)
    sample = asyncio.run(
        run_episode(
            env,
            task,
            seed,
            policy.generate,
            codec,
            SamplingParams(max_tokens=max_tokens),
            max_turns,
            max_episode_tokens,
            sample_id="s0",
            group_id="g0",
        )
    )
    asyncio.run(env.close())
    return sample, policy


async def run_groups(
    make_env,
    stream,
    codec,
    generate,
    *,
    num_groups,
    group_size,
    max_turns,
    max_episode_tokens=4096,
    concurrency=None,
    max_tokens=128,
):
    """The next ``num_groups`` tasks of ``stream`` as GRPO groups, run by the episode driver; samples in id order."""
    runner = EpisodeRunner(
        make_env, codec, generate, max_turns=max_turns, max_episode_tokens=max_episode_tokens, concurrency=concurrency
    )
    items = [item for g in range(num_groups) for item in group_items(f"g{g}", *stream.next(), group_size)]
    await asyncio.gather(*(runner.start(item, SamplingParams(max_tokens=max_tokens)) for item in items))
    samples, failed = runner.take()
    assert failed == []
    return sorted(samples, key=lambda s: s.sample_id)
