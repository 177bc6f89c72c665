"""The screen environment: the GUI state machine, its rendering, the tools, the checker and the tasks."""

import asyncio
import json
import random

import pytest
from env_helpers import play

from hetrl.config.env import EnvConfig, TaskSourceConfig
from hetrl.env.envs.gui import Button, Checkbox, Dropdown, Gui, ListBox, TextField, centre
from hetrl.env.envs.screen import FAMILIES, INK, ScreenEnv, ScreenTaskSource, check_state, render
from hetrl.env.registry import build_env, build_task_source
from hetrl.env.scripted import screen_plan, screen_script

SOURCE = ScreenTaskSource(size=48, seed=0)


def act(tool, **arguments):
    """A tool call in the Hermes format (``env_helpers.tool_call`` cannot pass key's argument ``name``)."""
    return f"<tool_call>{json.dumps({'name': tool, 'arguments': arguments})}</tool_call>"


def task_of(family):
    return next(SOURCE[i] for i in range(len(SOURCE)) if SOURCE[i].metadata["family"] == family)


def window():
    """A hand-built window with one widget of each kind (and a menu whose options hang over the list)."""
    return Gui(
        "Test",
        [
            TextField("field.name", (44, 17, 156, 30), label="Name", text="bob", max_chars=5),
            Checkbox("checkbox.blue", (6, 33, 40, 46), label="Blue"),
            Dropdown("dropdown.size", (44, 33, 120, 46), label="Size", options=["S", "M", "L"]),
            ListBox("list.files", (6, 49, 154, 87), items=[f"f{i}.txt" for i in range(6)]),
            Button("button.delete", (6, 101, 50, 115), label="Delete", default=True, deletes="list.files"),
            Button("button.cancel", (58, 101, 102, 115), label="Cancel"),
        ],
    )


def step(env, *calls):
    return asyncio.run(env.step({"role": "assistant", "content": "".join(calls)}))


def started(task):
    env = ScreenEnv()
    messages = asyncio.run(env.reset(task, seed=0))
    return env, messages


# --- the GUI model, without pixels ---------------------------------------------------------------------
def test_hit_testing_by_coordinates():
    gui = window()
    assert gui.widget_at(44, 17).name == "field.name" and gui.widget_at(155, 29).name == "field.name"
    assert gui.widget_at(156, 20) is None and gui.widget_at(44, 30) is None  # right and bottom edges are outside
    assert gui.widget_at(30, 40).name == "checkbox.blue"  # the label is part of a check box
    assert gui.widget_at(100, 5) is None  # the title bar is background
    listing = gui.widget("list.files")
    assert listing.rows == 3 and listing.row_box(1) == (7, 62, 153, 74)
    gui.click(60, 65)  # second visible row
    assert listing.selected == 1 and gui.focus is listing
    gui.click(100, 5)  # background: nothing changes, the focus stays
    assert gui.focus is listing and gui.pointer == (100, 5)
    with pytest.raises(ValueError, match=r"\(160, 0\) is outside the 160x120 screen"):
        gui.click(160, 0)


def test_an_open_menu_takes_clicks_above_the_widgets_below_it():
    gui = window()
    menu = gui.widget("dropdown.size")
    gui.click(*centre(menu.box))
    assert menu.open and gui.open_menu() is menu and menu.menu_box() == (44, 46, 120, 82)
    gui.click(*centre(menu.option_box(2)))  # over the list: the menu gets it
    assert menu.value() == "L" and not menu.open and gui.widget("list.files").selected is None
    gui.click(*centre(menu.box))
    gui.click(140, 20)  # outside the open menu: only closes it
    assert not menu.open and menu.value() == "L" and gui.focus is menu


def test_each_action_kind_on_the_model():
    gui = window()
    field, box = gui.widget("field.name"), gui.widget("checkbox.blue")
    listing, menu = gui.widget("list.files"), gui.widget("dropdown.size")
    gui.type("ignored")  # no text field has the focus: a real GUI drops the keystrokes too
    assert field.text == "bob"
    gui.click(*centre(field.box))
    gui.key("backspace")
    gui.type("xyz!")  # max_chars=5: what does not fit is dropped
    assert field.text == "boxyz"
    gui.key("Tab")  # names are case-insensitive
    assert gui.focus is box
    gui.key("space")
    assert box.checked
    gui.key("tab")
    gui.key("down")
    gui.key("enter")
    assert menu.value() == "M" and menu.open
    gui.key("escape")
    assert not menu.open
    gui.key("tab")
    for _ in range(5):
        gui.key("down")
    assert listing.selected == 4 and listing.offset == 2  # the selection scrolled into view
    gui.scroll(-9)
    assert listing.offset == 0
    gui.scroll(9)
    assert listing.offset == 3  # clamped: the last row shows the last item
    with pytest.raises(ValueError, match="unknown key 'f1'; valid keys: enter, tab"):
        gui.key("f1")
    with pytest.raises(ValueError, match="printable ASCII"):
        gui.type("caf\u00e9")
    gui.click(*centre(field.box))
    gui.key("enter")  # enter in a text field presses the default button
    assert gui.closed and gui.result == "Delete"
    assert gui.values() == {
        "field.name": "boxyz",
        "checkbox.blue": True,
        "dropdown.size": "M",
        "list.files": ["f0.txt", "f1.txt", "f2.txt", "f3.txt", "f5.txt"],
    }


def test_layout_round_trip_never_shares_state_with_the_task():
    gui = window()
    layout = gui.layout()
    assert json.loads(json.dumps(layout)) == layout
    copy = Gui.from_layout(layout)
    assert copy.layout() == layout
    copy.widget("list.files").selected = 0
    copy.press(copy.widget("button.delete"))
    assert len(copy.widget("list.files").items) == 5 and len(layout["widgets"][3]["items"]) == 6


# --- rendering ---------------------------------------------------------------------------------------
def test_rendering_is_deterministic_and_shows_the_state():
    gui = Gui.from_layout(SOURCE[0].metadata["layout"])
    first = render(gui)
    assert first.size == (160, 120) and first.mode == "RGB"
    same = first.tobytes() == render(Gui.from_layout(SOURCE[0].metadata["layout"])).tobytes()
    other = first.tobytes() != render(Gui.from_layout(SOURCE[4].metadata["layout"])).tobytes()  # same family
    assert same and other
    gui.click(3, 60)
    moved = render(gui)
    assert moved.tobytes() != first.tobytes() and moved.getpixel((4, 63)) == INK  # inside the pointer's arrow


def test_same_seed_same_screenshots(codec):
    def episode():
        task = ScreenTaskSource(size=8, seed=7)[2]  # a form with text to erase: seven turns
        sample, _ = play(ScreenEnv(), task, codec, screen_script(task), max_turns=20)
        return sample

    first, again = episode(), episode()
    assert first.num_turns == 7 and len(first.images) == 7
    assert first.images == again.images  # PNG bytes: the same pixels
    assert len(set(first.images)) == len(first.images)  # every action shows on screen
    assert ScreenTaskSource(size=8, seed=7)[2] == ScreenTaskSource(size=8, seed=7)[2]
    assert ScreenTaskSource(size=8, seed=8)[2].metadata != ScreenTaskSource(size=8, seed=7)[2].metadata


# --- the environment -----------------------------------------------------------------------------------
def test_images_are_content_parts_of_the_observations():
    env, messages = started(SOURCE[0])
    assert messages[0]["role"] == "system" and '"name": "scroll"' in messages[0]["content"]
    image, text = messages[-1]["content"]
    assert image["type"] == "image" and image["image"].size == (160, 120)
    assert text == {"type": "text", "text": SOURCE[0].messages[0]["content"]}
    result = step(env, act("click", x=3, y=60), act("key", name="tab"))
    assert [m["role"] for m in result.observations] == ["tool", "tool", "user"] and not result.done
    assert [m["content"] for m in result.observations[:2]] == ["clicked at (3, 60)", "pressed tab"]
    image, text = result.observations[-1]["content"]
    assert image["type"] == "image" and text["text"] == "The screen now (14 actions left)."
    assert result.info == {"num_tool_calls": 2, "num_tool_errors": 0}


def test_bad_tool_calls_are_error_observations():
    env, _ = started(SOURCE[0])
    result = step(
        env,
        act("click", x=500, y=3),
        act("click", x="40", y=3),
        act("key", name="f1"),
        act("type", text=""),
        act("drag", x=1),
        "<tool_call>{not json</tool_call>",
    )
    texts = [m["content"] for m in result.observations if m["role"] == "tool"]
    assert len(texts) == 6 and all(t.startswith("error:") for t in texts)
    assert "outside the 160x120 screen" in texts[0] and "argument 'x' must be of type integer" in texts[1]
    assert "unknown key 'f1'" in texts[2] and "printable ASCII" in texts[3] and "unknown tool 'drag'" in texts[4]
    assert "not valid JSON" in texts[5]
    assert not result.done and result.observations[-1]["role"] == "user"
    assert result.info == {"num_tool_calls": 6, "num_tool_errors": 6}


def test_episode_ends_at_max_steps(codec):
    task = task_of("form")
    sample, _ = play(ScreenEnv(max_steps=3), task, codec, lambda c: act("click", x=3, y=60), max_turns=10)
    assert sample.num_turns == 3 and sample.info["stop_reason"] == "done" and sample.rewards == {"env": 0.0}
    env = ScreenEnv(max_steps=2)
    asyncio.run(env.reset(task, seed=0))
    result = step(env, *[act("key", name="tab")] * 5)  # one turn of five calls: two run, then it ends
    assert result.done and result.reward == 0.0 and env.num_tool_calls == 2


def test_checker_judges_the_final_state_not_the_text(codec):
    task = task_of("checkboxes")
    plan = screen_plan(task)
    sample, _ = play(ScreenEnv(), task, codec, lambda c: "I checked the box and clicked " + task.answer["submit"])
    assert sample.num_turns == 1 and sample.rewards == {"env": 0.0}  # no tool call: the window is untouched
    gui = Gui.from_layout(task.metadata["layout"])
    assert check_state(gui, task.answer) == 0.0
    target = next(name for name, value in task.answer["values"].items() if gui.widget(name).value() != value)
    gui.widget(target).checked = task.answer["values"][target]
    assert check_state(gui, task.answer) == 0.0  # right values, but not submitted
    gui.press(next(w for w in gui.widgets if isinstance(w, Button) and w.label == "Cancel"))
    assert check_state(gui, task.answer) == 0.0  # closed by the wrong button
    gui.result = task.answer["submit"]
    assert check_state(gui, task.answer) == 1.0
    stray = next(w for w in gui.widgets if isinstance(w, Checkbox) and w.name != target)
    stray.checked = not stray.checked
    assert check_state(gui, task.answer) == 0.0  # a side effect elsewhere fails the task
    env, _ = started(task)
    result = step(env, *plan)  # the whole plan in one turn works too
    assert result.done and result.reward == 1.0


def test_scripted_policy_solves_every_task(codec):
    kinds = set()
    for i in range(len(SOURCE)):
        task = SOURCE[i]
        sample, _ = play(ScreenEnv(), task, codec, screen_script(task), max_turns=20)
        assert sample.rewards == {"env": 1.0} and sample.info["stop_reason"] == "done", (i, task.messages)
        assert len(sample.images) == sample.num_turns and sample.prompt_text.count("<image>") == 1
        kinds |= {json.loads(call[11:-12])["name"] for call in screen_plan(task)}
        assert task.metadata["layout"] == ScreenTaskSource(size=48, seed=0)[i].metadata["layout"]  # untouched
    assert kinds == {"click", "type", "key", "scroll"}
    assert {SOURCE[i].metadata["family"] for i in range(len(SOURCE))} == set(FAMILIES)


def test_random_and_wrong_policies_fail(codec):
    def random_actions(conversation):
        rng = random.Random(len(conversation))
        return rng.choice(
            [
                act("click", x=rng.randrange(160), y=rng.randrange(120)),
                act("key", name=rng.choice(["tab", "enter", "space", "down", "backspace"])),
                act("type", text=rng.choice(["cat", "blue", "a"])),
                act("scroll", dy=1),
            ]
        )

    rewards = [play(ScreenEnv(), SOURCE[i], codec, random_actions, max_turns=20)[0].rewards["env"] for i in range(24)]
    assert sum(rewards) <= 2
    for i in range(8):  # pressing the task's button at once leaves the goal undone
        task = SOURCE[i]
        submit = next(
            w
            for w in Gui.from_layout(task.metadata["layout"]).widgets
            if w.name.startswith("button.") and w.label == task.answer["submit"]
        )
        sample, _ = play(ScreenEnv(), task, codec, lambda c, box=submit.box: act("click", x=box[0] + 5, y=box[1] + 5))
        assert sample.num_turns == 1 and sample.rewards == {"env": 0.0}


def test_registry_builds_the_env_and_its_tasks():
    env = build_env(EnvConfig(name="screen", options={"max_steps": 5}, system_prompt="be quick"))
    assert isinstance(env, ScreenEnv) and env.max_steps == 5 and env.system_prompt.startswith("be quick")
    assert '"name": "click"' in env.system_prompt
    source = build_task_source(TaskSourceConfig(source="screen_tasks", size=4), seed=3)
    assert [source[i].task_id for i in range(4)] == [f"screen_tasks/{i}" for i in range(4)]
    json.dumps(source.content_of(source[0]))  # the held-out split compares tasks as JSON
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        ScreenEnv(max_steps=0)
