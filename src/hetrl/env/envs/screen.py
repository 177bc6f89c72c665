"""Computer use on a screen: the policy sees screenshots of a small window and acts with mouse and keys.

The window is a ``hetrl.env.envs.gui.Gui`` (widgets, focus, pointer: a state machine without pixels),
drawn here with PIL at 160x120 so that a tiny vision-language model can read it. The policy acts with
four tools, ``click(x, y)``, ``type(text)``, ``key(name)`` and ``scroll(dy)``, any number per turn; each
turn it gets one tool message per call (what was done, or an error) and a new screenshot. The episode
ends when a button closes the window, after ``max_steps`` actions, or on a reply without a tool call;
``check_state`` then judges the window's final state, never what the policy wrote.

Tasks come from ``ScreenTaskSource``: seeded layouts (a form, check boxes, drop-down menus, a file list)
and a goal in words. A task carries its layout and expected state (small, picklable, JSON-comparable);
the policy sees only the goal and the screenshots.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hetrl.env.base import Message, StepResult, Task
from hetrl.env.envs.gui import Box, Button, Checkbox, Dropdown, Gui, ListBox, TextField, Widget, centre
from hetrl.env.envs.tool_use import ToolEnv
from hetrl.env.tasks.base import ProceduralSource
from hetrl.env.tools import ParsedCalls, parse_tool_calls

WIDTH, HEIGHT = 160, 120

# --- rendering --------------------------------------------------------------------------------------
CHAR_WIDTH, CHAR_HEIGHT = 6, 11  # PIL's built-in bitmap font: monospaced, and the same pixels everywhere
BACKGROUND, TITLE_BAR, INK, PAPER = (212, 208, 200), (0, 64, 128), (0, 0, 0), (255, 255, 255)
BORDER, FOCUS, SELECTION, FACE = (64, 64, 64), (0, 90, 220), (0, 90, 220), (232, 232, 232)
POINTER = [(0, 0), (0, 10), (3, 7), (5, 11), (7, 10), (5, 6), (9, 6)]  # an arrow, its tip at the pointer


@functools.lru_cache(maxsize=1)
def _font():
    """The bitmap font (not FreeType's default since Pillow 10.1): identical pixels on every machine."""
    from PIL import ImageFont

    return getattr(ImageFont, "load_default_imagefont", ImageFont.load_default)()


def _outline(draw, box: Box, colour, width: int = 1) -> None:
    draw.rectangle((box[0], box[1], box[2] - 1, box[3] - 1), outline=colour, width=width)


def _fill(draw, box: Box, fill, outline=BORDER) -> None:
    draw.rectangle((box[0], box[1], box[2] - 1, box[3] - 1), fill=fill, outline=outline)


def _text(draw, xy: tuple[int, int], text: str, colour=INK) -> None:
    draw.text(xy, text, fill=colour, font=_font())


def _draw_field(draw, w: TextField, focused: bool) -> None:
    x0, y0, x1, y1 = w.box
    _text(draw, (4, y0 + 1), w.label)
    _fill(draw, w.box, PAPER, FOCUS if focused else BORDER)
    _text(draw, (x0 + 3, y0 + 1), w.text)
    if focused:  # the caret, always after the text
        caret = x0 + 3 + CHAR_WIDTH * len(w.text)
        draw.line((caret, y0 + 2, caret, y1 - 3), fill=INK)


def _draw_checkbox(draw, w: Checkbox, focused: bool) -> None:
    x0, y0, x1, y1 = w.box
    _fill(draw, (x0, y0 + 2, x0 + 10, y0 + 12), PAPER)
    if w.checked:
        draw.line((x0 + 2, y0 + 7, x0 + 4, y0 + 9, x0 + 8, y0 + 4), fill=INK, width=2)
    _text(draw, (x0 + 13, y0 + 1), w.label)
    if focused:
        _outline(draw, (x0 + 11, y0, x1, y1), FOCUS)


def _draw_button(draw, w: Button, focused: bool) -> None:
    _fill(draw, w.box, FACE, FOCUS if focused else BORDER)
    if w.default:  # a second border marks the button that enter presses
        _outline(draw, (w.box[0] + 1, w.box[1] + 1, w.box[2] - 1, w.box[3] - 1), BORDER)
    cx, cy = centre(w.box)
    _text(draw, (cx - CHAR_WIDTH * len(w.label) // 2, cy - CHAR_HEIGHT // 2), w.label)


def _draw_list(draw, w: ListBox, focused: bool) -> None:
    _fill(draw, w.box, PAPER, FOCUS if focused else BORDER)
    for row, item in enumerate(w.items[w.offset : w.offset + w.rows]):
        box = w.row_box(row)
        chosen = w.offset + row == w.selected
        if chosen:
            _fill(draw, box, SELECTION, None)
        _text(draw, (box[0] + 2, box[1]), item, PAPER if chosen else INK)
    if len(w.items) > w.rows:  # a scroll bar: its thumb shows which part of the list is visible
        x0, y0, x1, y1 = w.box[2] - 6, w.box[1] + 1, w.box[2] - 1, w.box[3] - 1
        _fill(draw, (x0, y0, x1, y1), BACKGROUND, None)
        top = y0 + (y1 - y0) * w.offset // len(w.items)
        _fill(draw, (x0, top, x1, top + (y1 - y0) * w.rows // len(w.items)), BORDER, None)


def _draw_dropdown(draw, w: Dropdown, focused: bool) -> None:
    x0, y0, x1, _ = w.box
    _text(draw, (4, y0 + 1), w.label)
    _fill(draw, w.box, PAPER, FOCUS if focused else BORDER)
    _text(draw, (x0 + 3, y0 + 1), w.value())
    draw.polygon([(x1 - 10, y0 + 5), (x1 - 4, y0 + 5), (x1 - 7, y0 + 9)], fill=INK)


def _draw_menu(draw, w: Dropdown) -> None:
    """An open drop-down's options, drawn over whatever lies below them."""
    _fill(draw, w.menu_box(), PAPER)
    for index, option in enumerate(w.options):
        box = w.option_box(index)
        if index == w.selected:
            _fill(draw, box, SELECTION, None)
        _text(draw, (box[0] + 3, box[1]), option, PAPER if index == w.selected else INK)
    _outline(draw, w.menu_box(), BORDER)


_DRAW: dict[type[Widget], Callable[..., None]] = {
    TextField: _draw_field,
    Checkbox: _draw_checkbox,
    Button: _draw_button,
    ListBox: _draw_list,
    Dropdown: _draw_dropdown,
}


def render(gui: Gui):
    """A screenshot of ``gui``: title bar, widgets (the focused one outlined), an open menu, the pointer."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (gui.width, gui.height), BACKGROUND)
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, gui.width - 1, 12), fill=TITLE_BAR)
    _text(draw, (4, 1), gui.title, PAPER)
    for widget in gui.widgets:
        _DRAW[type(widget)](draw, widget, widget is gui.focus)
    menu = gui.open_menu()
    if menu is not None:
        _draw_menu(draw, menu)
    px, py = gui.pointer
    draw.polygon([(px + dx, py + dy) for dx, dy in POINTER], fill=INK, outline=PAPER)
    return image


# --- tasks: seeded layouts, a goal in words, and the state that fulfils it ---------------------------
ROWS = (17, 33, 49, 65, 81)  # top pixel of each content row, below the title bar
ROW_HEIGHT = 13
BUTTON_SLOTS = (6, 58, 110)  # left edges of the 44-pixel buttons along the bottom row
FIELD_LABELS = ("Name", "City", "Pet", "Team", "Food", "Code", "Town", "Band")
WORDS = ("cat", "dog", "blue", "paris", "oslo", "rex", "milo", "tea", "jazz", "kiwi", "lima", "rome", "ace", "zed")
CHECK_LABELS = ("Red", "Green", "Blue", "Bold", "Italic", "Sound", "Wifi", "Music", "Maps", "Mail")
MENUS = {
    "Colour": ("Red", "Green", "Blue", "Yellow", "Black"),
    "Size": ("Small", "Medium", "Large", "Huge"),
    "Day": ("Mon", "Tue", "Wed", "Thu", "Fri"),
    "Font": ("Sans", "Serif", "Mono", "Script"),
}
FILES = (
    "report.txt",
    "notes.md",
    "data.csv",
    "photo.png",
    "todo.txt",
    "main.py",
    "budget.xls",
    "song.mp3",
    "paper.pdf",
    "draft.doc",
    "index.html",
    "logo.svg",
)


@dataclass
class Draft:
    """A generated task before it becomes a ``Task``: the window, the goal, and the values it must change."""

    title: str
    widgets: list[Widget]
    goal: str
    submit: str  # the label of the button that must close the window
    changes: dict[str, Any]


def _row(index: int, x0: int, x1: int) -> Box:
    return x0, ROWS[index], x1, ROWS[index] + ROW_HEIGHT


def _buttons(rng: random.Random, submit: str, others: tuple[str, ...], deletes: str | None = None) -> list[Button]:
    """The submit button (the default one) and distractors that also close the window, in seeded slots."""
    labels = [submit, *others]
    slots = rng.sample(BUTTON_SLOTS, len(labels))
    return [
        Button(
            f"button.{label.lower()}",
            (x, 101, x + 44, 115),
            label=label,
            default=label == submit,
            deletes=deletes if label == submit else None,
        )
        for label, x in zip(labels, slots)
    ]


def _form(rng: random.Random) -> Draft:
    labels = rng.sample(FIELD_LABELS, rng.randint(2, 3))
    rows = sorted(rng.sample(range(len(ROWS)), len(labels)))
    fields = [
        TextField(
            f"field.{label.lower()}",
            _row(row, 44, 156),
            label=label,
            text=rng.choice(WORDS) if rng.random() < 0.5 else "",
            max_chars=(156 - 44 - 6) // CHAR_WIDTH,
        )
        for label, row in zip(labels, rows)
    ]
    target = rng.choice(fields)
    word = rng.choice([w for w in WORDS if w != target.text])
    submit = rng.choice(("Submit", "OK", "Save", "Send"))
    return Draft(
        rng.choice(("Sign up", "Contact", "Profile")),
        [*fields, *_buttons(rng, submit, ("Cancel",))],
        f"Set the {target.label} field to '{word}', then press {submit}.",
        submit,
        {target.name: word},
    )


def _checkboxes(rng: random.Random) -> Draft:
    labels = rng.sample(CHECK_LABELS, rng.randint(3, 4))
    cells = sorted(rng.sample([(6 + 76 * col, row) for col in range(2) for row in range(4)], len(labels)))
    boxes = [
        Checkbox(
            f"checkbox.{label.lower()}",
            _row(row, x0, x0 + 13 + CHAR_WIDTH * len(label)),
            label=label,
            checked=rng.random() < 0.5,
        )
        for label, (x0, row) in zip(labels, cells)
    ]
    target = rng.choice(boxes)
    submit = rng.choice(("OK", "Apply", "Save"))
    goal = f"{'Uncheck' if target.checked else 'Check'} the box labelled '{target.label}', then click {submit}."
    return Draft(
        rng.choice(("Settings", "Options", "Preferences")),
        [*boxes, *_buttons(rng, submit, ("Cancel",))],
        goal,
        submit,
        {target.name: not target.checked},
    )


def _menus(rng: random.Random) -> Draft:
    labels = rng.sample(sorted(MENUS), 2)  # rows 0 and 1: an open menu of five options still fits the screen
    menus = [
        Dropdown(
            f"dropdown.{label.lower()}",
            _row(row, 44, 120),
            label=label,
            options=list(MENUS[label]),
            selected=rng.randrange(len(MENUS[label])),
        )
        for row, label in enumerate(labels)
    ]
    target = rng.choice(menus)
    option = rng.choice([o for o in target.options if o != target.value()])
    submit = rng.choice(("OK", "Apply"))
    return Draft(
        "Format",
        [*menus, *_buttons(rng, submit, ("Cancel",))],
        f"Choose '{option}' in the {target.label} menu, then click {submit}.",
        submit,
        {target.name: option},
    )


def _files(rng: random.Random) -> Draft:
    files = sorted(rng.sample(FILES, rng.randint(6, 9)))  # five rows show: a file further down needs a scroll
    listing = ListBox("list.files", (6, 17, 154, 17 + 5 * 12 + 2), items=files)
    target = rng.choice(files)
    buttons = _buttons(rng, "Delete", ("Open", "Cancel"), deletes=listing.name)
    return Draft(
        rng.choice(("Files", "Documents", "Downloads")),
        [listing, *buttons],
        f"Select the file '{target}', then press Delete.",
        "Delete",
        {listing.name: [f for f in files if f != target]},
    )


FAMILIES = {"form": _form, "checkboxes": _checkboxes, "menus": _menus, "files": _files}


def check_state(gui: Gui, expect: dict[str, Any]) -> float:
    """1.0 when the task's button closed the window and every widget holds the value the task expects,
    else 0.0. All values count, not just the target's: a stray edit elsewhere fails the task, as it would
    for a user. No partial credit, so the reward cannot be farmed by half-done forms."""
    return float(gui.result == expect["submit"] and gui.values() == expect["values"])


class ScreenTaskSource(ProceduralSource):
    """Seeded screen tasks cycling through ``FAMILIES``. The answer is the expected final state
    ({"submit": button label, "values": {widget name: value}}); the metadata holds the layout, which the
    environment draws and a scripted policy may read (``hetrl.env.scripted.screen_plan``); the policy only
    ever sees the goal and screenshots."""

    name = "screen_tasks"

    def make(self, rng: random.Random, index: int) -> Task:
        family = sorted(FAMILIES)[index % len(FAMILIES)]
        draft = FAMILIES[family](rng)
        gui = Gui(draft.title, draft.widgets, WIDTH, HEIGHT, (WIDTH // 2, HEIGHT // 2))
        expect = {"submit": draft.submit, "values": {**gui.values(), **draft.changes}}
        return Task(
            task_id=f"screen_tasks/{index}",
            source=self.name,
            messages=[{"role": "user", "content": draft.goal}],
            answer=expect,
            metadata={"family": family, "layout": gui.layout()},
        )


# --- the environment -------------------------------------------------------------------------------
class ScreenEnv(ToolEnv):
    """The screen tools over one ``Gui`` per episode; ``max_steps`` bounds the actions (tool calls, bad
    ones included), so a policy that never presses a button still ends."""

    base_prompt = (
        f"You operate a computer through its screen. Each turn you see a {WIDTH}x{HEIGHT} screenshot; "
        "pixel (0, 0) is the top-left corner, x grows to the right and y downwards. Use the tools to "
        "do the task; pressing a button closes the window and ends the task."
    )

    def __init__(self, system_prompt: str | None = None, max_steps: int = 16) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.max_steps = max_steps
        self.gui: Gui | None = None
        super().__init__([self.click, self.type, self.key, self.scroll], system_prompt)

    async def reset(self, task: Task, seed: int) -> list[Message]:
        """The goal with the first screenshot. Tasks hold no randomness beyond their layout: ``seed`` is unused."""
        if "layout" not in task.metadata:
            raise ValueError(f"task {task.task_id}: the screen env needs a layout (metadata['layout'])")
        self.gui = Gui.from_layout(task.metadata["layout"])
        messages = await super().reset(task, seed)
        messages[-1]["content"] = [
            {"type": "image", "image": render(self.gui)},
            {"type": "text", "text": messages[-1]["content"]},
        ]
        return messages

    async def step(self, action: Message) -> StepResult:
        """Run the calls in order (GUI actions do not commute), stopping once the window closes or the
        action budget is spent; then either the checker's reward or the tool messages and a screenshot."""
        if self.gui is None:
            raise RuntimeError("ScreenEnv.step before reset")
        parsed = parse_tool_calls(action)
        observations: list[Message] = []
        for call in parsed.calls:
            if self._over():
                break
            await self._record(observations, ParsedCalls(calls=[call]))
        if parsed.errors:
            await self._record(observations, ParsedCalls(errors=parsed.errors))
        if not parsed or self._over():
            return StepResult([], reward=await self.finish(action), done=True, info=self._counts())
        left = self.max_steps - self.num_tool_calls
        screenshot = [
            {"type": "image", "image": render(self.gui)},
            {"type": "text", "text": f"The screen now ({left} actions left)."},
        ]
        return StepResult([*observations, {"role": "user", "content": screenshot}], info=self._counts())

    async def _record(self, observations: list[Message], parsed: ParsedCalls) -> None:
        messages, num_errors = await self.registry.execute(parsed)
        observations += messages
        self.num_tool_calls += len(parsed.calls) + len(parsed.errors)
        self.num_tool_errors += num_errors

    def _over(self) -> bool:
        return self.gui.closed or self.num_tool_calls >= self.max_steps

    async def finish(self, action: Message) -> float:
        return check_state(self.gui, self.task.answer)

    # --- the tools (their docstrings are what the policy reads) ---------------------------------------
    async def click(self, x: int, y: int) -> str:
        """Click the mouse at a pixel of the screen.

        Args:
            x: Column of the pixel, 0 at the left edge.
            y: Row of the pixel, 0 at the top edge.
        """
        self.gui.click(x, y)
        return f"clicked at ({x}, {y})"

    async def type(self, text: str) -> str:
        """Type text into the text field that has the keyboard focus (click the field first).

        Args:
            text: Printable ASCII characters, at most 32.
        """
        self.gui.type(text)
        return f"typed {text!r}"

    async def key(self, name: str) -> str:
        """Press a key: enter, tab, backspace, space, up, down or escape.

        Args:
            name: The key's name, e.g. "enter".
        """
        self.gui.key(name)
        return f"pressed {name.strip().lower()}"

    async def scroll(self, dy: int) -> str:
        """Scroll the list on the screen.

        Args:
            dy: Rows to scroll; positive scrolls down, negative up.
        """
        self.gui.scroll(dy)
        return f"scrolled {'down' if dy >= 0 else 'up'} {abs(dy)}"
