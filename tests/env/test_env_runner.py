"""Token-in-token-out: what the trainer gets is exactly what was sampled plus observation tokens."""

import asyncio
import dataclasses

import pytest
from env_helpers import play, tool_call, tool_turns

from hetrl.env.base import Task
from hetrl.env.chat import ChatCodec
from hetrl.env.envs.single_answer import MathEnv
from hetrl.env.envs.tool_use import ToolMathEnv
from hetrl.models.tokenizer import build_char_tokenizer

TASK = Task("t0", "unit", [{"role": "user", "content": "What is (17 + 25) * 3 - 4?"}], answer="122")


def calculator_script(conversation: str) -> str:
    """Three tool turns (one of them malformed), then the answer."""
    turn = tool_turns(conversation)
    return [
        tool_call("calculator", expression="17 + 25"),
        "let me try <tool_call>{not json}</tool_call>",
        tool_call("calculator", expression="42 * 3 - 4"),
        "The result is <answer>122</answer>",
    ][turn]


def test_multi_turn_ids_are_sampled_ids_plus_observation_deltas(codec):
    env = ToolMathEnv(runner=None)
    sample, policy = play(env, TASK, codec, calculator_script)
    assert sample.info["stop_reason"] == "done" and sample.num_turns == 4 and sample.rewards["env"] == 1.0
    assert len(policy.calls) == 4
    full = sample.prompt_ids + sample.completion_ids
    offset = len(sample.prompt_ids)
    for prompt_ids, result in policy.calls:
        # each turn was generated from exactly the trajectory so far, and its ids are kept verbatim
        assert prompt_ids == full[:offset]
        assert full[offset : offset + len(result.response_ids)] == result.response_ids
        span = slice(offset - len(sample.prompt_ids), offset - len(sample.prompt_ids) + len(result.response_ids))
        assert sample.loss_mask[span] == [1] * len(result.response_ids)
        assert sample.logprobs[span] == result.logprobs
        assert sample.versions[span] == result.versions
        offset += len(result.response_ids)
        # then observation tokens up to the next generation (or the end)
        nxt = next((len(p) for p, _ in policy.calls if len(p) > offset), len(full))
        obs = slice(offset - len(sample.prompt_ids), nxt - len(sample.prompt_ids))
        assert (
            set(sample.loss_mask[obs]) <= {0}
            and set(sample.versions[obs]) <= {-1}
            and set(sample.logprobs[obs]) <= {0.0}
        )
        offset = nxt
    # the policy tokens are all generated tokens, in order
    policy_ids = [t for t, m in zip(sample.completion_ids, sample.loss_mask) if m]
    assert policy_ids == [t for _, r in policy.calls for t in r.response_ids]
    # and the whole sequence is what the chat template renders for the final conversation
    text = codec.decode(full)
    assert "<|im_start|>tool\nerror:" in text and "<|im_start|>tool\n42<|im_end|>" in text
    assert text.count("<|im_start|>assistant\n") == 4 and text.endswith("<answer>122</answer><|im_end|>")


def test_template_that_rewrites_history_still_gives_exact_delta():
    """A template that drops earlier assistant turns' content (like Qwen3's reasoning stripping)."""
    tok = build_char_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
        "{% if m['role'] == 'assistant' and not loop.last %}[old]{% else %}{{ m['content'] }}{% endif %}"
        "{{ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    codec = ChatCodec(tok)
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    ids = codec.observation_ids(history, [{"role": "tool", "content": "r"}], codec.encode("a<|im_end|>"))
    assert codec.decode(ids) == "\n<|im_start|>tool\nr<|im_end|>\n<|im_start|>assistant\n"


def test_turn_budget_ends_with_reason(codec):
    sample, policy = play(
        ToolMathEnv(runner=None), TASK, codec, lambda c: tool_call("calculator", expression="1+1"), max_turns=3
    )
    assert sample.info["stop_reason"] == "max_turns" and sample.finish_reason == "length"
    assert sample.num_turns == 3 and len(policy.calls) == 3


def test_token_budget_caps_generation_and_ends_with_reason(codec):
    env = ToolMathEnv(runner=None)
    budget = len(codec.prompt_ids(env.initial_messages(TASK))) + 150  # room for two and a half turns
    sample, policy = play(
        env, TASK, codec, lambda c: tool_call("calculator", expression="1+1"), max_episode_tokens=budget
    )
    assert sample.info["stop_reason"] == "max_episode_tokens" and sample.finish_reason == "length"
    assert len(sample.prompt_ids) + len(sample.completion_ids) <= budget
    # every generation was capped to the room left
    for prompt_ids, result in policy.calls:
        assert len(prompt_ids) + len(result.response_ids) <= budget


def test_prompt_longer_than_budget(codec):
    sample, policy = play(MathEnv(), TASK, codec, lambda c: "x", max_episode_tokens=20)
    assert sample.info["stop_reason"] == "prompt_too_long" and sample.completion_ids == [] and not policy.calls


def test_same_seed_same_episode(codec):
    from hetrl.config.env import TaskSourceConfig
    from hetrl.env.registry import build_task_stream

    def episode(seed):
        stream = build_task_stream(
            TaskSourceConfig(source="reasoning_gym", name="basic_arithmetic", size=50), seed=seed
        )
        task, episode_seed = stream.take(3)[-1]
        sample, _ = play(ToolMathEnv(runner=None), task, codec, calculator_script, seed=episode_seed)
        return dataclasses.asdict(sample)

    first, again, other = episode(7), episode(7), episode(8)
    assert first == again
    assert first["prompt_ids"] != other["prompt_ids"]


def test_engine_abort_ends_episode(codec):
    from hetrl.env.runner import run_episode
    from hetrl.records import GenerationResult, SamplingParams

    async def aborting(prompt_ids, sampling):
        return GenerationResult("r", 0, prompt_ids, [5, 6], [-1.0, -1.0], [3, 3], "abort", error="engine restarted")

    sample = asyncio.run(run_episode(MathEnv(), TASK, 0, aborting, codec, SamplingParams(), 4, 512, "s", "g"))
    assert sample.info["stop_reason"] == "abort" and sample.info["engine_error"] == "engine restarted"
    assert sample.completion_ids == [5, 6] and sample.min_version == 3


def test_images_need_an_engine_that_takes_them(codec):
    from hetrl.env.envs.multimodal import MultimodalEnv, ShapesSource
    from hetrl.env.runner import run_episode
    from hetrl.records import SamplingParams

    async def text_only(prompt_ids, sampling):
        raise AssertionError("must not be called")

    with pytest.raises(ValueError, match="images"):
        asyncio.run(
            run_episode(MultimodalEnv(), ShapesSource(4, 0)[0], 0, text_only, codec, SamplingParams(), 1, 512, "s", "g")
        )


def test_placeholder_text_is_not_an_image_for_a_vision_language_tokenizer():
    """'<image>' written in a message (a task, a tool's output, text the policy typed) must not become the
    image token: the engine would be sent one image fewer than placeholders."""
    from hetrl.models.hf import CHAR_IMAGE_TOKEN_ID

    codec = ChatCodec(build_char_tokenizer(128, image_token=True))
    image = object()
    ids = codec.prompt_ids(
        [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "typed '<image>'"}]}]
    )
    assert ids.count(CHAR_IMAGE_TOKEN_ID) == 1
    assert codec.prompt_ids([{"role": "tool", "content": "<image>"}]).count(CHAR_IMAGE_TOKEN_ID) == 0
    text_codec = ChatCodec(build_char_tokenizer(128))  # a text model's tokenizer spells it out: left as it is
    assert "<image>" in text_codec.render([{"role": "user", "content": "<image>"}], add_generation_prompt=False)
