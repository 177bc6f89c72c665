"""Episodes per second of the environment machinery alone (scripted policy, no model).

Two environments: ``math`` (single turn) and ``tool_math`` (three calculator calls, then the
answer: four policy turns, three observation deltas). Each runs through the rollout
role's episode driver, ``EpisodeRunner`` (64 concurrent episodes on one asyncio loop, token-delta
observations) — the contender — and through a
baseline loop that re-renders and re-tokenises the whole conversation every turn, which is what a
naive agent loop does and what token-in-token-out avoids. Medians of 3 repeats; one thread.

Headline: tool_math episodes/s of the contender.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from hetrl.config.env import EnvConfig, TaskSourceConfig  # noqa: E402
from hetrl.env.chat import ChatCodec  # noqa: E402
from hetrl.env.episodes import EpisodeRunner, group_items  # noqa: E402
from hetrl.env.registry import build_task_source, env_factory  # noqa: E402
from hetrl.env.scripted import ScriptedPolicy  # noqa: E402
from hetrl.env.tasks.base import TaskStream  # noqa: E402
from hetrl.models.tokenizer import build_char_tokenizer  # noqa: E402
from hetrl.records import SamplingParams  # noqa: E402

NUM_EPISODES = 256
REPEATS = 3
GOAL_TOOL_EPS = 200  # episodes/s: a 2-core env worker must keep well ahead of a CPU engine (~5-20 ep/s)
TASKS = TaskSourceConfig(source="reasoning_gym", name="basic_arithmetic", size=NUM_EPISODES)


def call(expression: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'calculator', 'arguments': {'expression': expression}})}</tool_call>"


def math_script(conversation: str) -> str:
    return "Adding up. <answer>42</answer>"


def tool_script(conversation: str) -> str:
    turn = conversation.count("<|im_start|>tool")
    return [call("17 + 25"), call("42 * 3"), call("126 - 4"), "<answer>122</answer>"][turn]


async def baseline_episodes(make_env, tasks, codec: ChatCodec, policy: ScriptedPolicy, max_turns: int) -> int:
    """The naive loop: the prompt of every turn is the whole conversation, re-tokenised."""
    tokenizer = codec.tokenizer
    for task, seed in tasks:
        env = make_env()
        messages = await env.reset(task, seed)
        for _ in range(max_turns):
            prompt = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)["input_ids"]
            result = await policy.generate(prompt, SamplingParams(max_tokens=256))
            action = {"role": "assistant", "content": codec.action_text(result.response_ids)}
            step = await env.step(action)
            messages += [action, *step.observations]
            if step.done:
                break
        await env.close()
    return len(tasks)


async def run_all(make_env, items, codec, policy, max_turns):
    runner = EpisodeRunner(
        make_env, codec, policy.generate, max_turns=max_turns, max_episode_tokens=4096, concurrency=64
    )
    await asyncio.gather(*(runner.start(item, SamplingParams(max_tokens=256)) for item in items))
    return runner.take()[0]


class Materialised:
    """The bench's tasks generated up front: both loops measure episodes, not task generation."""

    def __init__(self, source) -> None:
        self.name = source.name
        self.tasks = [source[i] for i in range(len(source))]

    def __len__(self) -> int:
        return len(self.tasks)

    def __getitem__(self, index: int):
        return self.tasks[index]


def measure(env_name: str, script, max_turns: int) -> tuple[float, float]:
    source = Materialised(build_task_source(TASKS, seed=0))
    codec = ChatCodec(build_char_tokenizer())
    policy = ScriptedPolicy(codec, script, record=False)
    make_env = env_factory(EnvConfig(name=env_name))
    contender, baseline = [], []
    for _ in range(REPEATS):
        items = [
            item
            for g, (task, seed) in enumerate(TaskStream(source, seed=0).take(NUM_EPISODES))
            for item in group_items(f"g{g}", task, seed, 1)
        ]
        start = time.perf_counter()
        samples = asyncio.run(run_all(make_env, items, codec, policy, max_turns))
        contender.append(NUM_EPISODES / (time.perf_counter() - start))
        if len(samples) != NUM_EPISODES or not all(s.rewards.get("env") is not None for s in samples):
            raise RuntimeError(f"{env_name}: an episode ended unscored")
        tasks = TaskStream(source, seed=0).take(NUM_EPISODES)
        start = time.perf_counter()
        asyncio.run(baseline_episodes(make_env, tasks, codec, policy, max_turns))
        baseline.append(NUM_EPISODES / (time.perf_counter() - start))
    return statistics.median(contender), statistics.median(baseline)


def main() -> None:
    results = {"math": measure("math", math_script, 1), "tool_math": measure("tool_math", tool_script, 4)}
    print(f"{'env':<10} {'EpisodeRunner ep/s':>19} {'re-tokenise ep/s':>17} {'ratio':>6}")
    for name, (ours, naive) in results.items():
        print(f"{name:<10} {ours:>19.0f} {naive:>17.0f} {ours / naive:>6.2f}")
    print(f"env_throughput: {results['tool_math'][0]:.0f}episodes/s (goal >= {GOAL_TOOL_EPS})")


if __name__ == "__main__":
    main()
