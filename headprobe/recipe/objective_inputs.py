"""What an objective takes, read from its function's signature without importing torch: `takes_predictor` (a
head's predictor outputs first, ``(p1, p2, z1, z2, ...)``, as simsiam) and `parameter_names` (its options are the
parameters after the two inputs). `recipe.checks` refuses a predictor an objective cannot take, and options it
does not have, from these."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys

from ..registry import OBJECTIVES

__all__ = ["parameter_names", "takes_predictor"]


def takes_predictor(objective: str) -> bool:
    """Whether objective `objective` takes a head's predictor outputs: its function's signature says so, by its
    first parameters ``(p1, p2, z1, z2, ...)`` (simsiam) rather than ``(z1, z2, ...)``."""
    parameters = parameter_names(OBJECTIVES.entry(objective).target)  # read without importing torch
    return next(iter(parameters), None) == "p1"


def parameter_names(target: str) -> list[str]:
    """The parameter names of the function ``"package.module:function"`` names, in `inspect.signature`'s order,
    read from the module's source when it defines the function at its top level (so that checking a recipe's
    `objective.options` does not import torch), else from the imported function's signature."""
    module, _, attr = target.partition(":")
    if module not in sys.modules:
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            with open(spec.origin, encoding="utf-8") as source:
                tree = ast.parse(source.read(), filename=spec.origin)
            for node in tree.body:
                if isinstance(node, ast.FunctionDef) and node.name == attr:
                    a = node.args
                    return [p.arg for p in (*a.posonlyargs, *a.args, *filter(None, [a.vararg]), *a.kwonlyargs,
                                            *filter(None, [a.kwarg]))]
    import inspect

    return list(inspect.signature(getattr(importlib.import_module(module), attr)).parameters)
