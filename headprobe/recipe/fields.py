"""A recipe's error, and the value ranges its numeric fields declare (`metadata=at_least(...)` on the schema's
fields; `Range` and its helpers live in `headprobe.registry`, below the probes whose options declare them too)."""

from __future__ import annotations

from ..registry import FRACTION, POSITIVE, Range, at_least, registered, within

__all__ = ["FRACTION", "POSITIVE", "Range", "RecipeError", "at_least", "check_range", "registered", "within"]


class RecipeError(ValueError):
    """A recipe or override that cannot be run; the message says where and how to fix it."""


def check_range(path: str, value: float, allowed: Range) -> None:
    """Raise RecipeError naming `path` when `value` is outside `allowed`."""
    if not allowed.contains(value):
        raise RecipeError(f"{path} = {value!r} is out of range; it must be {allowed.describe()}.")
