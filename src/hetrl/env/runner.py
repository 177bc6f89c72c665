"""Drive one episode: policy turns from an engine, observations from an environment, one Sample out.

The Sample's ``completion_ids`` are the sampled ids of every policy turn, verbatim, interleaved
with the observation ids the chat template adds between turns (``loss_mask`` 0, log-prob 0.0,
version -1; see ``hetrl.records``). Budgets: ``max_turns`` policy turns and ``max_episode_tokens``
tokens in all (prompt included); each generation is capped to what is left of the token budget.
Why the episode stopped is ``Sample.info["stop_reason"]``:

``done`` (the environment ended it), ``max_turns``, ``max_episode_tokens`` (no room for the next
turn, or the last generation hit the budget), ``prompt_too_long``, ``abort`` / ``rejected`` (the
engine gave up on the request).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from hetrl.env.base import Environment, Message, Task
from hetrl.env.chat import ChatCodec
from hetrl.models.images import to_png
from hetrl.records import CONVERSATION_KEY, ENV_REWARD_KEY, GenerationResult, Sample, SamplingParams

# (prompt_ids, sampling) -> result; an engine that takes images also accepts ``images=`` (a list).
GenerateFn = Callable[..., Awaitable[GenerationResult]]


def images_of(messages: list[Message]) -> list[Any]:
    """The images of a conversation's messages, in the order their placeholders are tokenised."""
    return [
        p["image"]
        for m in messages
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if p.get("type") == "image" and "image" in p
    ]


def _as_text(messages: list[Message]) -> list[dict[str, str]]:
    """The conversation with each message's content as text (an image part becomes ``<image>``)."""

    def text(content: Any) -> str:
        if isinstance(content, str):
            return content
        return "".join(p.get("text", "") if p.get("type") == "text" else "<image>" for p in content)

    return [{"role": m["role"], "content": text(m.get("content", ""))} for m in messages]


class _Trajectory:
    """The growing completion with its per-token lists kept aligned."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []

    def add_policy(self, result: GenerationResult) -> None:
        n = len(result.response_ids)
        if len(result.logprobs) != n or len(result.versions) != n:
            raise ValueError(
                f"engine result {result.request_id}: {n} tokens but {len(result.logprobs)} log-probs "
                f"and {len(result.versions)} versions"
            )
        self.ids += result.response_ids
        self.mask += [1] * n
        self.logprobs += result.logprobs
        self.versions += result.versions

    def add_observation(self, ids: list[int]) -> None:
        self.ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)


async def run_episode(
    env: Environment,
    task: Task,
    seed: int,
    generate: GenerateFn,
    tokenizer: Any,
    sampling: SamplingParams,
    max_turns: int,
    max_episode_tokens: int,
    sample_id: str,
    group_id: str,
) -> Sample:
    """Run ``task`` in ``env`` to the end and return the trainer-ready Sample (env not closed here).

    ``tokenizer`` is a HF tokenizer with a chat template, or a prebuilt ``ChatCodec`` (cheaper when
    many episodes share it). ``sampling.n`` is forced to 1: a group is several episodes.
    """
    if max_turns < 1 or max_episode_tokens < 1:
        raise ValueError(f"max_turns and max_episode_tokens must be >= 1, got {max_turns} and {max_episode_tokens}")
    codec = tokenizer if isinstance(tokenizer, ChatCodec) else ChatCodec(tokenizer)
    messages = list(await env.reset(task, seed))
    images = images_of(messages)
    if images and not accepts_images(generate):
        raise ValueError(f"task {task.task_id} has images but the generate function takes no images= argument")
    prompt_ids = codec.prompt_ids(messages)
    traj = _Trajectory()
    info: dict[str, Any] = {"turn_rewards": [], "seed": seed}
    stop_reason, finish_reason, num_turns = "prompt_too_long", "length", 0
    routed_experts = None
    while len(prompt_ids) < max_episode_tokens:
        room = max_episode_tokens - len(prompt_ids) - len(traj.ids)
        turn_sampling = replace(sampling, n=1, max_tokens=min(sampling.max_tokens, room))
        kwargs = {"images": images} if images else {}
        result = await generate(prompt_ids + traj.ids, turn_sampling, **kwargs)
        traj.add_policy(result)
        routed_experts = result.routed_experts  # the last turn's request ran the whole sequence: its routing covers it
        num_turns += 1
        finish_reason = result.finish_reason
        if finish_reason in ("abort", "rejected"):
            stop_reason = finish_reason
            info["engine_error"] = result.error
            break
        action = {"role": "assistant", "content": codec.action_text(result.response_ids)}
        step = await env.step(action)
        info["turn_rewards"].append(step.reward)
        info.update(step.info)
        messages.append(action)
        if step.done:
            stop_reason = "done"
            break
        if num_turns >= max_turns:
            stop_reason = "max_turns"
            break
        obs_ids = codec.observation_ids(messages, step.observations, result.response_ids)
        if len(prompt_ids) + len(traj.ids) + len(obs_ids) >= max_episode_tokens:
            stop_reason = "max_episode_tokens"
            break
        traj.add_observation(obs_ids)
        messages.extend(step.observations)
        images += images_of(step.observations)
    if stop_reason in ("max_turns", "max_episode_tokens", "prompt_too_long"):
        finish_reason = "length"
    info["stop_reason"] = stop_reason
    info[CONVERSATION_KEY] = _as_text(messages)  # what a judge or a reward model reads (hetrl.reward.base.conversation)
    scored = [r for r in info["turn_rewards"] if r is not None]
    return Sample(
        sample_id=sample_id,
        group_id=group_id,
        task_name=task.source,
        prompt_ids=prompt_ids,
        completion_ids=traj.ids,
        loss_mask=traj.mask,
        logprobs=traj.logprobs,
        versions=traj.versions,
        finish_reason=finish_reason,
        prompt_text=codec.decode(prompt_ids),
        completion_text=codec.decode(traj.ids),
        answer=task.answer,
        rewards={ENV_REWARD_KEY: float(sum(scored))} if scored else {},
        num_turns=num_turns,
        num_tool_calls=int(info.get("num_tool_calls", 0)),
        info=info,
        images=[to_png(image) for image in images],
        routed_experts=routed_experts,  # PNG: a fraction of a PIL image's pickle
    )


def accepts_images(generate: GenerateFn) -> bool:
    """Whether ``generate`` takes an ``images=`` keyword (engines for multimodal models do)."""
    try:
        params = inspect.signature(generate).parameters
    except (TypeError, ValueError):
        return False
    return "images" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
