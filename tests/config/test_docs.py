"""The recipe-key reference is generated from the schema and must stay in step with it."""

from pathlib import Path

from pydantic import BaseModel

from hetrl.config.docs import render
from hetrl.config.schema import HetrlConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "recipe_keys.md"


def _all_fields(model: type[BaseModel], prefix=""):
    for name, field in model.model_fields.items():
        yield f"{prefix}{name}", field
        for arg in (field.annotation, *getattr(field.annotation, "__args__", ())):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                yield from _all_fields(arg, f"{prefix}{name}.")


def test_every_key_has_a_description():
    missing = [key for key, field in _all_fields(HetrlConfig) if not field.description]
    assert missing == []


def test_recipe_key_reference_is_up_to_date():
    assert DOC.read_text() == render(), "regenerate: python -m hetrl.config.docs > docs/recipe_keys.md"
