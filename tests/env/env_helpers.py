"""Helpers shared by the env tests (a plain module: conftest fixtures cannot be imported)."""

import asyncio
import json
import re

from hetrl.env.runner import run_episode
from hetrl.env.scripted import ScriptedPolicy
from hetrl.types import SamplingParams


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
    sample = asyncio.run(run_episode(env, task, seed, policy.generate, codec, SamplingParams(max_tokens=max_tokens),
                                     max_turns, max_episode_tokens, sample_id="s0", group_id="g0"))
    asyncio.run(env.close())
    return sample, policy
