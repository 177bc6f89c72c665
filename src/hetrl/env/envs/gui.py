"""A tiny GUI as a state machine: one window of widgets, a focus, a pointer, hit-testing and keys.

Nothing here draws: ``hetrl.env.envs.screen`` renders this model to a screenshot and judges its final
state. Keeping the two apart lets the tests drive the behaviour without pixels, and makes the checker
read widget values, never the policy's text. A ``Gui`` is built from a layout of plain dicts and lists
(what a task carries, so tasks stay picklable and JSON-comparable) and holds one episode's state; there
is no shared state, so building one per episode is cheap.

Deliberate simplifications: a text field's caret is always at the end of its text; any button closes
the window (a dialog), a ``deletes`` button first removing its list's selected item; a click outside an
open drop-down menu only closes the menu (as in most toolkits); ``scroll`` moves the window's list, of
which there is at most one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

Box = tuple[int, int, int, int]  # (x0, y0, x1, y1): a point is inside when x0 <= x < x1 and y0 <= y < y1

KEYS = ("enter", "tab", "backspace", "space", "up", "down", "escape")
MAX_TYPED_CHARS = 32  # per type() call: a policy cannot paste a novel into a field


def inside(box: Box, x: int, y: int) -> bool:
    return box[0] <= x < box[2] and box[1] <= y < box[3]


def centre(box: Box) -> tuple[int, int]:
    return (box[0] + box[2]) // 2, (box[1] + box[3]) // 2


@dataclass
class Widget:
    """A named rectangle that can take the focus; subclasses say what clicks and keys do to it."""

    kind: ClassVar[str]
    name: str
    box: Box

    def click(self, gui: Gui, x: int, y: int) -> None:
        """A click inside ``box`` (the widget already has the focus); by default nothing more happens."""

    def key(self, gui: Gui, name: str) -> None:
        """A key pressed while this widget has the focus; by default it is ignored."""

    def value(self) -> Any:
        """What the checker judges; None for widgets without a value (buttons)."""
        return None

    def to_layout(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self), "box": list(self.box)}


@dataclass
class TextField(Widget):
    kind = "field"
    label: str = ""
    text: str = ""
    max_chars: int = 16  # what fits the box: typing beyond it is dropped, as the screenshot shows

    def type(self, text: str) -> None:
        self.text = (self.text + text)[: self.max_chars]

    def key(self, gui: Gui, name: str) -> None:
        if name == "backspace":
            self.text = self.text[:-1]
        elif name == "enter":  # as in a web form: enter in a field presses the default button
            gui.press_default()

    def value(self) -> str:
        return self.text


@dataclass
class Checkbox(Widget):
    """Its box covers the label too: clicking the label toggles it, as in most toolkits."""

    kind = "checkbox"
    label: str = ""
    checked: bool = False

    def click(self, gui: Gui, x: int, y: int) -> None:
        self.checked = not self.checked

    def key(self, gui: Gui, name: str) -> None:
        if name in ("space", "enter"):
            self.checked = not self.checked

    def value(self) -> bool:
        return self.checked


@dataclass
class Button(Widget):
    kind = "button"
    label: str = ""
    default: bool = False  # pressed by enter in a text field
    deletes: str | None = None  # name of a list whose selected item this button removes before closing

    def click(self, gui: Gui, x: int, y: int) -> None:
        gui.press(self)

    def key(self, gui: Gui, name: str) -> None:
        if name in ("space", "enter"):
            gui.press(self)


@dataclass
class ListBox(Widget):
    """A scrollable list of items drawn in rows of ``row_height`` pixels; ``offset`` is the top row's item."""

    kind = "list"
    items: list[str] = field(default_factory=list)
    row_height: int = 12
    selected: int | None = None
    offset: int = 0

    @property
    def rows(self) -> int:
        """How many rows are visible (a 1-pixel border on each side)."""
        return (self.box[3] - self.box[1] - 2) // self.row_height

    def row_box(self, row: int) -> Box:
        """The box of visible row ``row`` (0 = top), which shows item ``offset + row``."""
        y0 = self.box[1] + 1 + row * self.row_height
        return self.box[0] + 1, y0, self.box[2] - 1, y0 + self.row_height

    def click(self, gui: Gui, x: int, y: int) -> None:
        row = (y - self.box[1] - 1) // self.row_height
        if 0 <= row < self.rows and self.offset + row < len(self.items):
            self.selected = self.offset + row

    def key(self, gui: Gui, name: str) -> None:
        if name in ("up", "down") and self.items:
            start = -1 if self.selected is None else self.selected
            self.selected = min(max(start + (1 if name == "down" else -1), 0), len(self.items) - 1)
            self.offset = min(self.offset, self.selected)  # keep the selection visible
            self.offset = max(self.offset, self.selected - self.rows + 1)

    def scroll(self, dy: int) -> None:
        self.offset = min(max(self.offset + dy, 0), max(len(self.items) - self.rows, 0))

    def remove_selected(self) -> None:
        if self.selected is not None:
            del self.items[self.selected]
            self.selected = None
            self.scroll(0)  # re-clamp the offset to the shorter list

    def value(self) -> list[str]:
        return list(self.items)


@dataclass
class Dropdown(Widget):
    """A closed box showing the chosen option; open, a menu of options hangs below it, one per row."""

    kind = "dropdown"
    label: str = ""
    options: list[str] = field(default_factory=list)
    selected: int = 0
    option_height: int = 12
    open: bool = False

    def option_box(self, index: int) -> Box:
        y0 = self.box[3] + index * self.option_height
        return self.box[0], y0, self.box[2], y0 + self.option_height

    def menu_box(self) -> Box:
        return self.box[0], self.box[3], self.box[2], self.box[3] + len(self.options) * self.option_height

    def click(self, gui: Gui, x: int, y: int) -> None:
        self.open = not self.open

    def choose_at(self, y: int) -> None:
        """A click at row ``y`` inside the open menu picks that option and closes the menu."""
        self.selected = (y - self.box[3]) // self.option_height
        self.open = False

    def key(self, gui: Gui, name: str) -> None:
        if name in ("up", "down"):
            self.selected = min(max(self.selected + (1 if name == "down" else -1), 0), len(self.options) - 1)
        elif name in ("enter", "space"):
            self.open = not self.open
        elif name == "escape":
            self.open = False

    def value(self) -> str:
        return self.options[self.selected]


WIDGET_KINDS: dict[str, type[Widget]] = {cls.kind: cls for cls in (TextField, Checkbox, Button, ListBox, Dropdown)}


@dataclass
class Gui:
    """One window: its widgets (in tab order, later ones drawn on top), focus, pointer, and how it closed.

    The four actions (``click``, ``type``, ``key``, ``scroll``) raise ValueError for arguments no real
    input device could produce (a point off the screen, an unknown key); the environment turns that into
    an error observation. Everything else is legal input, and input a real GUI would ignore is ignored.
    """

    title: str
    widgets: list[Widget]
    width: int = 160
    height: int = 120
    pointer: tuple[int, int] = (80, 60)
    focus: Widget | None = None
    result: str | None = None  # the label of the button that closed the window

    @classmethod
    def from_layout(cls, layout: dict[str, Any]) -> Gui:
        widgets = []
        for spec in layout["widgets"]:  # lists are copied: an episode must never edit its task's layout
            args = {k: (list(v) if isinstance(v, list) else v) for k, v in spec.items() if k != "kind"}
            widgets.append(WIDGET_KINDS[spec["kind"]](**{**args, "box": tuple(spec["box"])}))
        return cls(layout["title"], widgets, layout["width"], layout["height"], tuple(layout["pointer"]))

    def layout(self) -> dict[str, Any]:
        """The window as plain data (focus and result aside: a layout is a window before any input)."""
        return {
            "title": self.title,
            "width": self.width,
            "height": self.height,
            "pointer": list(self.pointer),
            "widgets": [w.to_layout() for w in self.widgets],
        }

    @property
    def closed(self) -> bool:
        return self.result is not None

    def widget(self, name: str) -> Widget:
        return next(w for w in self.widgets if w.name == name)

    def open_menu(self) -> Dropdown | None:
        return next((w for w in self.widgets if isinstance(w, Dropdown) and w.open), None)

    def widget_at(self, x: int, y: int) -> Widget | None:
        """The topmost widget whose box holds (x, y), or None for the window's background."""
        return next((w for w in reversed(self.widgets) if inside(w.box, x, y)), None)

    def values(self) -> dict[str, Any]:
        """Every widget's value by name: the state a task's checker compares with what it expects."""
        return {w.name: w.value() for w in self.widgets if w.value() is not None}

    # --- the policy's actions ----------------------------------------------------------------------
    def click(self, x: int, y: int) -> None:
        if not (0 <= x < self.width and 0 <= y < self.height):
            raise ValueError(f"({x}, {y}) is outside the {self.width}x{self.height} screen")
        self.pointer = (x, y)
        menu = self.open_menu()
        if menu is not None:
            if inside(menu.menu_box(), x, y):
                menu.choose_at(y)
            menu.open = False
            return
        target = self.widget_at(x, y)
        if target is not None:
            self.focus = target
            target.click(self, x, y)

    def type(self, text: str) -> None:
        if not 0 < len(text) <= MAX_TYPED_CHARS or not all(" " <= c <= "~" for c in text):
            raise ValueError(f"text must be 1 to {MAX_TYPED_CHARS} printable ASCII characters, got {text!r}")
        if isinstance(self.focus, TextField):
            self.focus.type(text)

    def key(self, name: str) -> None:
        name = name.strip().lower()
        if name not in KEYS:
            raise ValueError(f"unknown key {name!r}; valid keys: {', '.join(KEYS)}")
        if name == "tab":
            self._focus_next()
        elif self.focus is not None:
            self.focus.key(self, name)

    def scroll(self, dy: int) -> None:
        lists = [w for w in self.widgets if isinstance(w, ListBox)]
        if lists:
            lists[0].scroll(dy)

    # --- what widgets ask of the window -------------------------------------------------------------
    def press(self, button: Button) -> None:
        if button.deletes is not None:
            self.widget(button.deletes).remove_selected()
        self.result = button.label

    def press_default(self) -> None:
        default = next((w for w in self.widgets if isinstance(w, Button) and w.default), None)
        if default is not None:
            self.press(default)

    def _focus_next(self) -> None:
        """Tab: the next widget in layout order takes the focus (an open menu closes, as focus leaves it)."""
        if isinstance(self.focus, Dropdown):
            self.focus.open = False
        index = next((i for i, w in enumerate(self.widgets) if w is self.focus), -1)
        self.focus = self.widgets[(index + 1) % len(self.widgets)]
