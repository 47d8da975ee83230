"""How a recipe error names what was expected: `type_name` (a field's type in words: "a list of int", "null",
"'a' | 'b'") and `yaml_number_hint` (why `1e-3` arrived as text under YAML 1.1, and how to write it)."""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, Union

__all__ = ["type_name", "yaml_number_hint"]


def yaml_number_hint(value: Any, integer: bool = False) -> str:
    """Why a number written like `1e-3` arrived as text: YAML 1.1 reads an exponent without a dot and a sign as a
    string. Empty when the value is not such a number."""
    import decimal

    if not isinstance(value, str) or "e" not in value.lower():
        return ""
    try:
        number = decimal.Decimal(value.strip())
    except decimal.InvalidOperation:
        return ""
    if integer:
        if number != number.to_integral_value():
            return ""
        written = str(int(number))
    else:
        mantissa, exponent = value.strip().lower().split("e")
        written = (mantissa if "." in mantissa else mantissa + ".0") + "e" + (
            exponent if exponent.startswith(("+", "-")) else "+" + exponent)
    return f" YAML reads {value!r} as text (an exponent needs a dot and a sign); write {written}."


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {type_name(typing.get_args(tp)[0])}"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))
