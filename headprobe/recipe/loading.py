"""Recipes from YAML: reading the file, ``--set key.sub=value`` overrides, sweeps, and the generic checker that
turns plain data into the schema's dataclasses.

The checker reads each field's declaration (`recipe.schema`): its type, its range and the registry its names
come from; `check_recipe` (`recipe.checks`) then relates fields to each other. Every refusal is a `RecipeError`
naming the key path, the bad value, the allowed values and a "did you mean".

>>> load_recipe({}, ["heads=[{name: h}]", "heads.0.depth=3"]).heads[0].depth
3
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from headprobe.recipe.safe_yaml import AliasLimitError, BoundedAliasLoader

from ..registry import Registry, UnavailablePluginError
from .checks import check_recipe
from .fields import check_range
from .null_heads import with_null_heads
from .schema import NoOptions, Recipe, RecipeError, did_you_mean_hint, not_allowed, unregistered
from .sweeps import NO_SWEEP, sweep_folder_name, sweep_items
from .type_names import type_name, yaml_number_hint


class _NotFinite(RecipeError):
    """A NaN or infinite number where a finite one is needed; raised through unions (never a type mismatch)."""


def load_recipe(
    source: str | Path | dict, overrides: list[str] | None = None, values: dict[str, Any] | None = None
) -> Recipe:
    """Read a recipe file (or dict), apply ``KEY=VALUE`` overrides, validate, return a `Recipe`.

    `values` are overrides given as Python objects (``{"train.epochs": 1}``), applied after `overrides`.
    A recipe with a `sweep:` has every combination validated here too, exactly as `expand_sweep` makes them.
    """
    return _from_data(resolve_recipe_data(source, overrides, values))


def load_section(cls: type, data: Any, path: str) -> Any:
    """One section of a recipe (e.g. a `HeadSpec` from a head's config as results.json records it), with every
    field's type, range and registered name checked as `load_recipe` checks them; `path` names it in messages."""
    return _build(cls, data, path)


def dump_recipe(recipe: Recipe) -> str:
    return yaml.safe_dump(recipe.to_dict(), sort_keys=False)


# --- YAML ---------------------------------------------------------------------------------


def _default_name(stem: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).lstrip("._-")[:128]
    return name or "run"


class _DuplicateKey(Exception):
    def __init__(self, key: Any, first: int, line: int) -> None:
        super().__init__(f"duplicate key {key!r} at line {line} (first given at line {first}); keep one of them")
        self.key, self.first, self.line = key, first, line


class _RecipeShape(Exception):
    """A recipe file nested deeper than `MAX_DEPTH`, or with a key YAML reads as a boolean."""


# A recipe is a few levels deep (section, entry, option, list); far deeper is a mistake or an attack on the parser.
MAX_DEPTH = 64
MAX_RECIPE_BYTES = 10 * 2**20


class _RecipeLoader(BoundedAliasLoader):
    """`yaml.SafeLoader` that refuses a key given twice in one mapping (PyYAML keeps the last silently), aliases
    that expand past `safe_yaml.MAX_ALIAS_NODES` nodes (`safe_yaml.BoundedAliasLoader`), nesting past `MAX_DEPTH`
    (before Python's recursion limit would) and keys YAML 1.1 reads as booleans (``on:``, ``no:``)."""

    _depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise _RecipeShape(f"it nests deeper than {MAX_DEPTH} levels (at line {line}); a recipe needs a few")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                if key_node.tag == "tag:yaml.org,2002:bool":
                    raise _RecipeShape(f"the key `{key_node.value}` at line {key_node.start_mark.line + 1} is read "
                                       f"by YAML as a boolean; quote it ('{key_node.value}':)")
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    continue
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise _DuplicateKey(key, seen[key], line)
                seen[key] = line
        return super().construct_mapping(node, deep)


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_RecipeLoader)  # noqa: S506 (a SafeLoader subclass)


def resolve_recipe_data(source: str | Path | dict, overrides: list[str] | None, values: dict[str, Any] | None) -> dict:
    """The recipe's plain data with defaults and overrides applied, not yet validated."""
    if isinstance(source, dict):
        data, default_name = copy.deepcopy(source), "run"
    else:
        path = Path(source)
        if not path.exists():
            raise RecipeError(f"recipe file {str(path)!r} does not exist; pass the path to a .yaml recipe.")
        if not path.is_file():
            raise RecipeError(f"recipe {str(path)!r} is not a regular file (a folder, device or FIFO); pass the path "
                              "to a .yaml recipe file.")
        if path.stat().st_size > MAX_RECIPE_BYTES:
            raise RecipeError(f"recipe {str(path)!r} has {path.stat().st_size:,} bytes; a recipe is a few KB of "
                              "YAML, so this is not one.")
        try:
            data = _yaml_load(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as err:
            raise RecipeError(f"recipe {str(path)!r} is not UTF-8 text (byte {err.start} cannot be decoded); "
                              "save it as UTF-8 YAML, e.g. recipes/quickstart.yaml.") from None
        except OSError as err:
            raise RecipeError(f"recipe {str(path)!r} cannot be read ({err.strerror or err}); check that it is "
                              "a readable file.") from None
        except (_DuplicateKey, AliasLimitError, _RecipeShape) as err:
            raise RecipeError(f"recipe {str(path)!r}: {err}.") from None
        except yaml.YAMLError as err:
            raise RecipeError(f"recipe {str(path)!r} is not valid YAML: {err}") from None
        if data is None:
            raise RecipeError(f"recipe {str(path)!r} is empty; a recipe is a mapping of keys to values, "
                              "e.g. `backbone: {id: scratch:vit-tiny}` (see recipes/quickstart.yaml).")
        default_name = _default_name(path.stem)
    if not isinstance(data, dict):
        raise RecipeError(f"a recipe must be a mapping of keys to values, got {type(data).__name__}.")
    data.setdefault("name", default_name)
    # Overrides refine the default probe set instead of replacing it.
    data.setdefault("probes", {name: {} for name in Recipe().probes})
    for item in overrides or []:
        apply_override(data, item)
    for key, value in (values or {}).items():
        set_value(data, key, copy.deepcopy(value), f"override {key}={value!r}")
    return data


# --- overrides ----------------------------------------------------------------------------


def apply_override(data: dict, item: str) -> None:
    """Apply one ``a.b.c=value`` (value parsed as YAML) to a nested dict in place; ``heads.0.act=swish``
    indexes a list."""
    key, sep, raw = item.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise RecipeError(
            f"override {item!r} is not KEY=VALUE; write e.g. --set backbone.pooling=mean "
            "or --set probes.knn.ks=[10,20]."
        )
    try:
        value = _yaml_load(raw) if raw.strip() else None
    except (_DuplicateKey, AliasLimitError) as err:
        raise RecipeError(f"override {item!r}: {err}.") from None
    except yaml.YAMLError as err:
        raise RecipeError(f"override {item!r}: the value is not valid YAML ({err}).") from None
    set_value(data, key, value, f"override {item!r}")


def set_value(data: dict, key: str, value: Any, label: str | None = None) -> None:
    """Set ``a.b.c`` (a Python value, not parsed) in a nested dict in place; ``heads.0.act`` indexes a list."""
    label = label or f"override {key!r}"
    if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
        raise RecipeError(f"{label}: {key!r} is not a dotted key such as train.epochs.")
    parts = key.split(".")
    node: Any = data
    for i, part in enumerate(parts):
        where = ".".join(parts[: i + 1])
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise RecipeError(f"{label}: {where} is not an index of a list of {len(node)} items "
                                  f"(use 0 to {len(node) - 1}).")
            part = int(part)
        elif not isinstance(node, dict):
            parent = ".".join(parts[:i])
            raise RecipeError(f"{label}: {parent} is {node!r}, not a section with keys.")
        if last:
            node[part] = value
            return
        if isinstance(node, dict) and node.get(part) is None:
            node[part] = {}
        node = node[part]


# --- sweeps -------------------------------------------------------------------------------


def _from_data(data: dict) -> Recipe:
    recipe = _build(Recipe, data, "")
    recipe.heads = with_null_heads(recipe.heads, recipe.null_heads)
    check_recipe(recipe)
    for label, items in _sweep_items(recipe):
        combo = copy.deepcopy(data)
        try:
            for item in items:
                apply_override(combo, item)
            for item in NO_SWEEP:
                apply_override(combo, item)
            _from_data(combo)
        except RecipeError as err:
            raise RecipeError(f"sweep combination {label}: {err}") from None
    return recipe


def _sweep_items(recipe: Recipe) -> list[tuple[str, list[str]]]:
    """[(label, ["key=value", ...])] for every run of the recipe's sweep (`sweeps.sweep_items`)."""
    return sweep_items(recipe.sweep, recipe.sweep_zip, recipe.sweep_labels)


def expand_sweep(source: str | Path | dict, overrides: list[str] | None = None) -> list[tuple[str, list[str]]]:
    """A recipe with `sweep: {key: [values], ...}` (and/or `sweep_zip`, `sweep_labels`) → [(label, overrides)], one
    per run (`sweeps.sweep_items`). Every run's recipe is validated (by `load_recipe`), before anything runs. A
    recipe without a sweep gives one entry with label ""."""
    recipe = load_recipe(source, overrides)
    combos = _sweep_items(recipe)
    if not combos:
        return [("", list(overrides or []))]
    return [(sweep_folder_name(label), list(overrides or []) + items + NO_SWEEP) for label, items in combos]


# --- the generic checker: types, declared ranges, registered names --------------------------


def _build(cls: type, data: Any, path: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path or 'recipe'} must be a mapping of keys, got {data!r}.")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        where = f"{path}.{key}" if path else str(key)
        raise RecipeError(f"unknown key {where!r}; allowed keys here: {', '.join(fields)}."
                          f"{did_you_mean_hint(str(key), list(fields))}")
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            continue
        where = f"{path}.{name}" if path else name
        if f.metadata.get("named"):
            kwargs[name] = _build_named_section(data[name], where, f.metadata["registry"])
            continue
        value = _coerce(hints[name], data[name], where)
        _check_declared(f, value, where)
        kwargs[name] = value
    return cls(**kwargs)


def _check_declared(f: dataclasses.Field, value: Any, where: str) -> None:
    """The field's declared range and registry (`recipe.schema`), on the value or on each item of a list."""
    if value is None:
        return
    items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
    for i, item in items:
        at = where if i is None else f"{where}[{i}]"
        if "range" in f.metadata:
            check_range(at, item, f.metadata["range"])
        registry = f.metadata.get("registry")
        if registry is not None and item not in registry:
            raise unregistered(f"{at} = {item!r}", registry, item)


def _build_named_section(value: Any, path: str, registry: Registry) -> dict:
    """``probes: {linear: {...}, knn: null}``: each key a registered name, each value its options."""
    if isinstance(value, list):
        value = {name: None for name in value}
    if not isinstance(value, dict):
        raise RecipeError(f"{path} must map {registry.family} names to options, got {value!r}.")
    out = {}
    for name, options in value.items():
        if name not in registry:
            raise unregistered(f"{path}.{name}", registry, name)
        try:
            declared = registry.load_entry(name, options=True)
        except UnavailablePluginError as err:
            raise RecipeError(f"{path}.{name}: {err}") from None
        out[name] = _build(declared or NoOptions, options, f"{path}.{name}")
    return out


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    if origin in (Union, types.UnionType):
        named = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is not None and len(named) == 1 and typing.get_origin(named[0]) is Literal:
            return _coerce(named[0], value, path)  # an optional choice: the choices' own message
        for arg in typing.get_args(tp):
            try:
                return _coerce(arg, value, path)
            except _NotFinite:
                raise
            except RecipeError:
                continue
        raise RecipeError(f"{path} = {value!r} has the wrong type; expected {type_name(tp)}.")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise not_allowed(path, value, [str(a) for a in allowed])
        return value
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise RecipeError(f"{path} = {value!r} has the wrong type; expected {type_name(tp)}.")
        return [_coerce(item_tp, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is Any:
        return value
    if tp is type(None):
        if value is not None:
            raise RecipeError(f"{path} = {value!r}: expected null.")
        return None
    if tp is bool:
        if not isinstance(value, bool):
            raise RecipeError(f"{path} = {value!r} has the wrong type; expected true or false.")
        return value
    if tp is int:
        if isinstance(value, float) and not math.isfinite(value):
            raise _NotFinite(f"{path} = {value!r} is not a finite number; give an integer.")
        if isinstance(value, bool) or not isinstance(value, int):
            hint = yaml_number_hint(value, integer=True)
            raise RecipeError(f"{path} = {value!r} has the wrong type; expected an integer.{hint}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecipeError(f"{path} = {value!r} has the wrong type; expected a number.{yaml_number_hint(value)}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise _NotFinite(f"{path} = {value!r} is not a finite number; give an ordinary number "
                             "(NaN and infinities are not accepted).")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise RecipeError(f"{path} = {value!r} has the wrong type; expected a string.")
        return value
    raise TypeError(f"recipe schema type {tp!r} at {path} is not supported")
