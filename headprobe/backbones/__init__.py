"""Backbones: one id string resolves architecture → weights → preprocessing."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from torch import nn

from ..registry import BACKBONES, UnknownNameError, split_prefixed
from .base import Backbone, BackboneNotFoundError, Preprocess, seeded
from .own_module import as_backbone, module_id
from .tuning import apply_tuning, load_adapter, save_adapter


def call_with_options(factory: Callable, id: str, options: dict):
    """Call a family's loader with the options it takes; `None` means "not set"; any other unknown option is
    an error naming the ones it takes (`seed` is passed where taken, ignored elsewhere)."""
    params = inspect.signature(factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return factory(**{k: v for k, v in options.items() if v is not None})
    taken = [name for name, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    given = {k: v for k, v in options.items() if v is not None and (k in taken or k != "seed")}
    unknown = [k for k in given if k not in taken]
    if unknown:
        raise ValueError(f"backbone {id} does not take option(s) {', '.join(unknown)}; it takes: "
                         f"{', '.join(t for t in taken if t != 'seed')}.")
    return factory(**given)


def load_backbone(
    id: str | None = None,
    *,
    module: nn.Module | None = None,
    preprocess: Preprocess | None = None,
    dim: int | None = None,
    seed: int = 0,
    **options,
) -> Backbone:
    """Resolve a backbone id to a frozen `Backbone`: ``hf:<id or dir>``, ``open_clip:<arch>[/<tag or file>]``,
    ``timm:<name>[/<file> or /random]``, ``offline:<name>``, ``scratch:<name>``.

    Options: ``pooling`` (cls, mean, cls+mean, pooler), ``layer`` (-1: final features; i: block i) or
    ``layers`` (a list, concatenated), ``resolution``, ``revision`` (hf). Randomly initialised weights
    (scratch, open_clip without tag, timm ``/random``) depend on ``seed`` only. Options left at ``None``
    are ignored; an option a family does not take is an error.

    Or wrap your own module: ``load_backbone(module=net, preprocess=Preprocess(...), dim=512)``,
    where ``net(pixels: (B, 3, H, W)) -> (B, dim)``.

    >>> bb = load_backbone("offline:dinov2-vits14", pooling="cls")  # doctest: +SKIP
    >>> bb.dim  # doctest: +SKIP
    384
    """
    if module is not None:
        if id is not None or preprocess is None or dim is None:
            raise ValueError("to wrap your own module pass module=, preprocess= and dim= (and no id).")
        return Backbone(module, lambda m, x: m(x), id=module_id(module), dim=dim,
                        preprocess=preprocess, description="user module", options=options).freeze()
    if id is None:
        raise ValueError("load_backbone needs an id such as 'offline:dinov2-vits14' or 'hf:facebook/dinov2-small'.")
    try:
        prefix, ref = split_prefixed(id, BACKBONES)
    except UnknownNameError as err:
        raise ValueError(f"backbone id {id!r}: {err}") from None
    loader = _bind(BACKBONES.get(prefix), ref)
    options, resolution = _plug_in_options(loader, options)
    with seeded(seed):
        backbone = call_with_options(loader, id, {**options, "seed": seed})
    if not isinstance(backbone, Backbone):  # a plug-in loader may return a bare module (`own_module` contract)
        backbone = as_backbone(backbone, resolution)
        backbone.id = id
    elif resolution is not None:
        raise ValueError(f"backbone {id} does not take option resolution (its loader returns a Backbone with its "
                         "own preprocessing); remove backbone.resolution.")
    return backbone.freeze()


# Recipe defaults a plug-in loader need not take: the features as the loader makes them.
_LOADER_DEFAULTS = {"pooling": "cls", "layer": -1}


def _plug_in_options(loader: Callable, options: dict) -> tuple[dict, int | None]:
    """(the options for `loader`, a resolution it does not take, which a bare module it returns is wrapped at):
    `_LOADER_DEFAULTS` at their default values are dropped where the loader does not take them, so a plug-in's
    loader declares only the options it has. The built-in loaders take them all, so nothing changes for them."""
    params = inspect.signature(loader).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return options, None
    options = {k: v for k, v in options.items()
               if k in params or k not in _LOADER_DEFAULTS or v != _LOADER_DEFAULTS[k]}
    if "resolution" in params:
        return options, None
    return {k: v for k, v in options.items() if k != "resolution"}, options.get("resolution")


def _bind(loader: Callable, ref: str) -> Callable:
    """`loader(ref, **kw)` with the keyword parameters of `loader`, so `call_with_options` can read them."""

    def bound(**kw):
        return loader(ref, **kw)

    bound.__signature__ = inspect.Signature(
        [p for p in inspect.signature(loader).parameters.values()
         if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD)]
    )
    return bound


__all__ = [
    "Backbone",
    "BackboneNotFoundError",
    "Preprocess",
    "apply_tuning",
    "as_backbone",
    "load_adapter",
    "load_backbone",
    "save_adapter",
]
