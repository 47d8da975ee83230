"""Reading a training checkpoint without running anything it names: every object outside torch's weights-only
allow-list becomes an inert placeholder.

A training checkpoint holds more than tensors. facebookresearch/vicreg's ``main_vicreg.py`` saves
``optimizer.state_dict()`` of its LARS, whose ``param_groups`` keep the function ``exclude_bias_and_norm`` as
``weight_decay_filter`` and ``lars_adaptation_filter``; ``torch.load(weights_only=True)`` refuses such a file, and a
full unpickle would import ``main_vicreg`` and could run anything the file names. Here the file's globals are listed
first without running anything (``torch.serialization.get_unsafe_globals_in_checkpoint``, a static scan of the
pickle), and each one outside torch's allow-list is mapped, for this load only, to its own `Skipped` class. torch's
weights-only unpickler then reads the file: a bare reference (the optimiser's function) is the `Skipped` class
itself; an object the file would build by calling or instantiating that global is a `Skipped` instance, made by
`Skipped`'s own constructor, which keeps nothing it is given. Nothing the file names is imported or called.
torch still refuses its blocked modules (``os``, ``sys``, ``posix``, ``nt``) and any object it cannot build safely
(a dict subclass filled by the file, a call of a call's result); such a file is not loaded.

`skipped_objects(content)` lists where the placeholders are (``optimizer.param_groups[0].weight_decay_filter``), for
the checkpoint record in ``results.json``.

>>> content = read_inert("model.pth")  # doctest: +SKIP
>>> skipped_objects(content)  # doctest: +SKIP
{'main_vicreg.exclude_bias_and_norm': {'count': 2, 'at': ['optimizer.param_groups[0].weight_decay_filter', ...]}}
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, ClassVar

import torch

__all__ = ["Skipped", "is_skipped", "read_inert", "skipped_objects"]

# Paths kept per skipped global in the record (a file can hold millions of references to one function).
MAX_PATHS = 5


class Skipped:
    """An object of a checkpoint that was not rebuilt. Each skipped global gets its own subclass, whose `name` is
    the global (``main_vicreg.exclude_bias_and_norm``); the subclass stands for a bare reference and an instance for
    an object the file would have built from it. Construction and ``__setstate__`` keep nothing: the arguments the
    file passes (which may be other placeholders) are dropped."""

    name: ClassVar[str] = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs

    def __setstate__(self, state: Any) -> None:
        del state

    def __repr__(self) -> str:
        return f"<skipped object built by {self.name}>"


def placeholder(name: str) -> type[Skipped]:
    """A fresh `Skipped` subclass standing for the global `name`."""
    return type(f"Skipped[{name}]", (Skipped,), {"name": name, "__module__": __name__})


def is_skipped(value: Any) -> bool:
    """Whether `value` is a placeholder: a `Skipped` subclass (a reference) or instance (a built object)."""
    return isinstance(value, Skipped) or (isinstance(value, type) and issubclass(value, Skipped))


def unsafe_globals(path: Path) -> list[str]:
    """The globals of `path` outside torch's weights-only allow-list, read without unpickling; [] for a legacy
    (pre-zip) file, which the plain weights-only load reads or refuses."""
    try:
        return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except ValueError:
        return []


def read_inert(path: Path, *, allowed: tuple[type, ...] = (), mmap: bool = True) -> Any:
    """The content of the torch checkpoint `path`: tensors, numbers, strings, plain containers, the classes in
    `allowed` (DINO's ``argparse.Namespace``) and `Skipped` placeholders for every other global. Raises
    ``pickle.UnpicklingError`` where torch's unpickler refuses the file even so (blocked modules)."""
    names = [n for n in unsafe_globals(path) if n not in {f"{c.__module__}.{c.__qualname__}" for c in allowed}]
    stand_ins = [(placeholder(n), n) for n in names]
    with torch.serialization.safe_globals([*allowed, *stand_ins]):
        if not mmap:
            return torch.load(path, map_location="cpu", weights_only=True)
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as err:
            if "zip" not in str(err).lower() and "mmap" not in str(err).lower():
                raise
            return torch.load(path, map_location="cpu", weights_only=True)  # legacy files cannot be mapped


def _children(value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [(f".{k}" if isinstance(k, str) else f"[{k!r}]", v) for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [(f"[{i}]", v) for i, v in enumerate(value)]
    if isinstance(value, argparse.Namespace):
        return [(f".{k}", v) for k, v in vars(value).items()]
    return []


def skipped_objects(content: Any) -> dict[str, dict]:
    """{global: {"count": n, "at": [the first paths, e.g. 'optimizer.param_groups[0].weight_decay_filter']}} for
    every placeholder in `content` (a dict key that is one is reported at its dict)."""
    found: dict[str, dict] = {}
    stack: list[tuple[str, Any]] = [("", content)]
    while stack:
        path, value = stack.pop()
        if is_skipped(value):
            entry = found.setdefault(value.name, {"count": 0, "at": []})
            entry["count"] += 1
            if len(entry["at"]) < MAX_PATHS:
                entry["at"].append(path.lstrip(".") or "(the whole file)")
            continue
        if isinstance(value, dict):
            for key in value:
                if is_skipped(key):
                    stack.append((f"{path}[key]", key))
        stack.extend((path + step, child) for step, child in reversed(_children(value)))
    return dict(sorted(found.items()))
