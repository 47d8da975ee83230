"""A recipe's error and the value ranges its numeric fields declare (`metadata=at_least(...)` on the schema's
fields), in a module of their own so the schema, the loaders and the checks share them."""

from __future__ import annotations

from dataclasses import dataclass


class RecipeError(ValueError):
    """A recipe or override that cannot be run; the message says where and how to fix it."""


# --- messages -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Range:
    """The values a numeric field (or each item of a list field) takes: a lower bound and maybe an upper one,
    each open or closed."""

    low: float
    high: float | None = None
    open_low: bool = False
    open_high: bool = False

    def describe(self) -> str:
        low, high = self.low, self.high
        if high is None:
            return f"> {low:g}" if self.open_low else f">= {low}"
        if not self.open_low and not self.open_high and isinstance(high, int):
            return f"in [{low}, {high}]"
        return f"in {'(' if self.open_low else '['}{low:g}, {high:g}{')' if self.open_high else ']'}"

    def check(self, path: str, value: float) -> None:
        below = value <= self.low if self.open_low else value < self.low
        above = self.high is not None and (value >= self.high if self.open_high else value > self.high)
        if below or above:
            raise RecipeError(f"{path} = {value!r} is out of range; it must be {self.describe()}.")


def at_least(low: float) -> dict:
    return {"range": Range(low)}


def within(low: float, high: float, open_high: bool = False) -> dict:
    return {"range": Range(low, high, open_high=open_high)}


def registered(registry) -> dict:
    """Metadata of a name field (or list of names) whose values are `registry`'s names."""
    return {"registry": registry}


POSITIVE = {"range": Range(0, open_low=True)}
# A share of the images: 0 or 1 would leave one side of the split empty.
FRACTION = {"range": Range(0, 1, open_low=True, open_high=True)}
