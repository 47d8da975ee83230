"""Sweeps: the runs a recipe's ``sweep:`` (every combination), ``sweep_zip:`` (the i-th values together) and
``sweep_labels:`` (their names) ask for, each as a label and the overrides that make it.

A key is a dotted override key (``heads.0.act``) or a nested mapping of them (``backbone: {id: [...]}``, which is
what ``--set sweep.backbone.id=[a,b]`` writes); its values are a non-empty list. Without `sweep_labels` each run is
named by what it changes: ``act=swish`` for a value, and for a whole block (``backbone: [{...}, {...}]``) the leaves
that differ between the blocks, ``backbone.id=offline:dinov2-vits14``, never a dict's repr.

>>> [label for label, _ in sweep_items({"heads.0.act": ["relu", "swish"]}, {"seed": [0, 1]}, None)]
['seed=0-act=relu', 'seed=0-act=swish', 'seed=1-act=relu', 'seed=1-act=swish']
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping
from typing import Any

import yaml

from .fields import RecipeError
from .folder_names import folder_name_problem


def flatten_sweep(sweep: Mapping[str, Any], section: str, prefix: str = "") -> dict[str, list]:
    """{dotted key: values}; nested mappings are keys' parts. `section` names the recipe key in messages."""
    out: dict[str, list] = {}
    for key, values in sweep.items():
        where = f"{prefix}{key}"
        if isinstance(values, Mapping) and values:
            out |= flatten_sweep(values, section, f"{where}.")
        elif isinstance(values, list) and values:
            out[where] = values
        else:
            raise RecipeError(f"{section}.{where} must be a non-empty list of values (one run each), got {values!r}; "
                              f"e.g. {section}: {{heads.0.act: [relu, swish]}}.")
    return out


def _leaves(value: Any, path: str = "") -> dict[str, Any]:
    """{dotted path: scalar} of nested mappings and lists (list items by index)."""
    if isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, list) and any(isinstance(v, (Mapping, list)) for v in value):
        items = enumerate(value)
    else:
        return {path: value}
    out: dict[str, Any] = {}
    for key, item in items:
        out |= _leaves(item, f"{path}.{key}" if path else str(key))
    return out


def _value_labels(key: str, values: list, short: str) -> list[str]:
    """One label per value of `key`: ``short=value``; a block's leaves that differ between its values."""
    if not any(isinstance(v, (Mapping, list)) and _leaves(v) != {"": v} for v in values):
        return [f"{short}={v}" for v in values]
    leaves = [_leaves(v) for v in values]
    paths = list(dict.fromkeys(p for leaf in leaves for p in leaf))
    varying = [p for p in paths if len({repr(leaf.get(p)) for leaf in leaves}) > 1]
    if not varying:
        return [f"{short}={i}" for i in range(len(values))]
    # A block lacking every varying leaf (it keeps their defaults) is named by its index.
    return [",".join(f"{key}.{p}={leaf[p]}" if p else f"{key}={leaf[p]}" for p in varying if p in leaf)
            or f"{short}={i}" for i, leaf in enumerate(leaves)]


def _short_names(keys: list[str]) -> dict[str, str]:
    """Each key's last part (``act`` for heads.0.act), or the whole key where two keys end alike."""
    last = [k.split(".")[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last, strict=True)}


def _override(key: str, value: Any) -> str:
    return f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"


def sweep_items(sweep: Mapping[str, Any] | None, zipped: Mapping[str, Any] | None,
                labels: list[str] | None) -> list[tuple[str, list[str]]]:
    """[(label, ["key=value", ...])] for every run: each row of `zipped` (the i-th value of every key together) with
    every combination of `sweep` (keys in order); [] without either. `labels` names the runs in this order."""
    grid = flatten_sweep(sweep or {}, "sweep")
    rows = flatten_sweep(zipped or {}, "sweep_zip")
    if not grid and not rows:
        if labels:
            raise RecipeError("sweep_labels names the runs of a sweep, but the recipe has no sweep or sweep_zip.")
        return []
    lengths = {k: len(v) for k, v in rows.items()}
    if len(set(lengths.values())) > 1:
        raise RecipeError(f"sweep_zip takes the i-th value of every key together, so its lists must be equally "
                          f"long; they have {', '.join(f'{k}: {n}' for k, n in lengths.items())}.")
    clash = sorted(set(grid) & set(rows))
    if clash:
        raise RecipeError(f"{clash[0]} is in both sweep and sweep_zip; keep it in one of them.")
    short = _short_names([*rows, *grid])
    texts = {k: _value_labels(k, v, short[k]) for k, v in (rows | grid).items()}
    zip_rows = list(zip(*(range(n) for n in lengths.values()), strict=True)) if rows else [()]
    out = []
    for zi, gi in itertools.product(zip_rows, itertools.product(*(range(len(v)) for v in grid.values()))):
        chosen = list(zip(rows, zi, strict=True)) + list(zip(grid, gi, strict=True))
        items = [_override(k, (rows | grid)[k][i]) for k, i in chosen]
        out.append(("-".join(texts[k][i] for k, i in chosen), items))
    if labels is not None:
        if len(labels) != len(out):
            raise RecipeError(f"sweep_labels has {len(labels)} names for {len(out)} runs; give one per run, in the "
                              f"order {', '.join(label for label, _ in out)}.")
        for i, label in enumerate(labels):
            if (problem := folder_name_problem(label)) is not None:
                raise RecipeError(f"sweep_labels[{i}] = {label!r} {problem}; each label names one run's folder "
                                  "inside the sweep's, so use a plain name such as 'relu_run'.")
        if len(set(labels)) != len(labels):
            raise RecipeError(f"sweep_labels = {labels} must be distinct names (each names a run's folder).")
        out = [(name, items) for name, (_, items) in zip(labels, out, strict=True)]
    folders = [sweep_folder_name(label) for label, _ in out]
    twice = next((f for f in folders if folders.count(f) > 1), None)
    if twice is not None:
        raise RecipeError(f"two runs of the sweep would share the folder {twice!r} (their labels differ only in "
                          "characters a folder name cannot hold); name the runs with sweep_labels.")
    return out


def sweep_size(sweep: Mapping[str, Any] | None, zipped: Mapping[str, Any] | None) -> int:
    """How many runs a sweep makes (0 without one)."""
    return len(sweep_items(sweep, zipped, None))


# What makes one run of a sweep a plain run.
NO_SWEEP = ["sweep={}", "sweep_zip={}", "sweep_labels=null"]

# Folder names are at most 255 bytes on common file systems; a longer sweep label is cut with a hash.
MAX_FOLDER_BYTES = 200


def sweep_folder_name(label: str) -> str:
    """A sweep combination's label → its run folder's name: '/' and '\\' replaced, and a label over `MAX_FOLDER_BYTES`
    bytes cut and suffixed with a hash of the whole label (each run's config.yaml and results.json keep the full
    values). A label that is empty, ``.`` or ``..`` names no folder inside the sweep's and is refused."""
    name = label.replace("/", "_").replace("\\", "_").replace("\0", "_")
    if (problem := folder_name_problem(name)) is not None:
        raise RecipeError(f"the sweep label {label!r} {problem}; give the run a plain name with sweep_labels.")
    raw = name.encode()
    if len(raw) <= MAX_FOLDER_BYTES:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:12]
    head = raw[: MAX_FOLDER_BYTES - len(digest) - 1].decode(errors="ignore")
    return f"{head}-{digest}"
