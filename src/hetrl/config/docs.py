"""Render the recipe-key reference (docs/recipe_keys.md) from the schema's field descriptions.

``python -m hetrl.config.docs > docs/recipe_keys.md``; a test keeps the file in step with the code.
"""

from __future__ import annotations

import sys
import typing

from pydantic import BaseModel

from hetrl.config.schema import HetrlConfig


def _type_name(annotation) -> str:
    if typing.get_origin(annotation) is typing.Literal:
        return " \\| ".join(repr(a) for a in typing.get_args(annotation))
    args = typing.get_args(annotation)
    if args:
        return " \\| ".join(_type_name(a) for a in args)
    return "null" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


def _section_model(annotation) -> type[BaseModel] | None:
    candidates = [annotation, *typing.get_args(annotation)]
    return next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)


def _rows(model: type[BaseModel], prefix: str, sections: list[tuple[str, type[BaseModel]]]) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        sub = _section_model(field.annotation)
        if sub is not None:
            sections.append((key, sub))
            continue
        default = field.get_default(call_default_factory=True)
        rows.append(f"| `{key}` | {_type_name(field.annotation)} | `{default!r}` | {field.description or ''} |")
    return rows


def render() -> str:
    lines = [
        "# Recipe keys",
        "",
        "Every key a recipe or a `key=value` override may set, generated from the schema",
        "(`python -m hetrl.config.docs > docs/recipe_keys.md`). Unknown keys are errors.",
        "",
    ]
    sections: list[tuple[str, type[BaseModel]]] = []
    top = _rows(HetrlConfig, "", sections)
    lines += ["## top level", "", "| key | type | default | meaning |", "|---|---|---|---|", *top, ""]
    while sections:
        key, model = sections.pop(0)
        rows = _rows(model, f"{key}.", sections)
        doc = (model.__module__ and sys.modules[model.__module__].__doc__ or "").strip().splitlines()
        lines += [
            f"## `{key}`",
            "",
            doc[0] if doc else "",
            "",
            "| key | type | default | meaning |",
            "|---|---|---|---|",
            *rows,
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render())
