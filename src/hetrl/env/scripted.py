"""A scripted (non-model) policy: replies chosen by a function of the conversation so far.

It stands in for an engine wherever the environment machinery itself is under test or measured
(tests, ``bench/env_throughput.py``): same ``generate`` signature as an engine client, sampled ids
are the reply's tokens plus end-of-turn, with made-up but deterministic log-probs. Being a pure
function of the prompt, one instance serves any number of concurrent episodes.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

from hetrl.env.base import Task
from hetrl.env.chat import ChatCodec
from hetrl.env.envs.gui import Button, Checkbox, Dropdown, Gui, ListBox, TextField, Widget, centre
from hetrl.records import GenerationResult, SamplingParams


class ScriptedPolicy:
    """``script(conversation_text) -> reply text``; every call is kept in ``calls`` for inspection."""

    def __init__(self, codec: ChatCodec, script: Callable[[str], str], version: int = 0, record: bool = True) -> None:
        self.codec = codec
        self.script = script
        self.version = version
        self.record = record
        self.calls: list[tuple[list[int], GenerationResult]] = []
        self._ids = itertools.count()
        self._eos = codec.tokenizer.eos_token_id

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, images: list[Any] | None = None
    ) -> GenerationResult:
        reply_ids = self.codec.encode(self.script(self.codec.decode(prompt_ids))) + [self._eos]
        finish = "stop"
        if len(reply_ids) > sampling.max_tokens:
            reply_ids, finish = reply_ids[: sampling.max_tokens], "length"
        result = GenerationResult(
            request_id=f"scripted-{next(self._ids)}",
            sample_index=0,
            prompt_ids=list(prompt_ids),
            response_ids=reply_ids,
            logprobs=[-0.01 * (1 + t % 7) for t in reply_ids],
            versions=[self.version] * len(reply_ids),
            finish_reason=finish,
        )
        if self.record:
            self.calls.append((list(prompt_ids), result))
        return result


# --- a scripted solver of the screen environment's tasks -----------------------------------------------
def _call(tool: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': tool, 'arguments': arguments})}</tool_call>"


def _click(point: tuple[int, int]) -> str:
    return _call("click", x=point[0], y=point[1])


def _set_field(field: TextField, want: str) -> list[str]:
    return [_click(centre(field.box)), *[_call("key", name="backspace")] * len(field.text), _call("type", text=want)]


def _set_checkbox(box: Checkbox, want: bool) -> list[str]:
    return [_click((box.box[0] + 5, box.box[1] + 7))]  # the square itself, not the label


def _set_dropdown(menu: Dropdown, want: str) -> list[str]:
    return [_click(centre(menu.box)), _click(centre(menu.option_box(menu.options.index(want))))]


def _select_removed(listing: ListBox, want: list[str]) -> list[str]:
    """Select the one item ``want`` lacks (the task's button deletes it), scrolling it into view first."""
    index = next(i for i, item in enumerate(listing.items) if item not in want)
    below = index - (listing.offset + listing.rows - 1)
    calls = [_call("scroll", dy=below)] if below > 0 else []
    return [*calls, _click(centre(listing.row_box(index - listing.offset - max(below, 0))))]


_SETTERS: dict[type[Widget], Callable[[Any, Any], list[str]]] = {
    TextField: _set_field,
    Checkbox: _set_checkbox,
    Dropdown: _set_dropdown,
    ListBox: _select_removed,
}


def screen_plan(task: Task) -> list[str]:
    """The tool calls, one per turn, that solve a ``screen_tasks`` task (``hetrl.env.envs.screen``).

    Read off the task's layout and expected values: the trusted side's view, which the model's prompt
    never holds. Positions come from the widgets' own geometry (the code that hit-tests and draws them),
    so the plan clicks where the screenshot shows things. Each widget whose value must change is set
    with the mouse (a field's old text erased with backspace); a form is then submitted with enter,
    anything else by clicking the task's button.
    """
    gui, expect = Gui.from_layout(task.metadata["layout"]), task.answer
    calls, last = [], None
    for widget in gui.widgets:
        want = expect["values"].get(widget.name)
        if widget.name in expect["values"] and want != widget.value():
            calls += _SETTERS[type(widget)](widget, want)
            last = widget
    if isinstance(last, TextField):
        return [*calls, _call("key", name="enter")]
    submit = next(w for w in gui.widgets if isinstance(w, Button) and w.label == expect["submit"])
    return [*calls, _click(centre(submit.box))]


def screen_script(task: Task, image_marker: str = "<image>") -> Callable[[str], str]:
    """A ``ScriptedPolicy`` script playing ``screen_plan(task)``: the turn is told by the screenshots so
    far (``image_marker`` is how the chat codec renders one), so it stays a pure function of the prompt."""
    plan = screen_plan(task)

    def script(conversation: str) -> str:
        turn = conversation.count(image_marker) - 1
        return plan[turn] if turn < len(plan) else "done"

    return script
