"""The strict base every recipe section derives from.

Unknown keys are errors (a misspelt key must never be silently ignored), and every field carries a
``description`` that becomes the recipe-key reference in docs/recipe_keys.md.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A recipe section: extra keys forbidden, assignments re-validated, no silent coercion of str->int."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=False, frozen=False)
