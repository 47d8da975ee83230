"""Backbones: one id string resolves architecture → weights → preprocessing."""

from __future__ import annotations

from torch import nn

from ..registry import BACKBONES, UnknownNameError, split_prefixed
from .base import Backbone, BackboneNotFoundError, Preprocess


def load_backbone(
    id: str | None = None,
    *,
    module: nn.Module | None = None,
    preprocess: Preprocess | None = None,
    dim: int | None = None,
    **options,
) -> Backbone:
    """Resolve a backbone id (``hf:<id or dir>``, ``offline:<name>``) to a frozen `Backbone`.

    Or wrap your own module: ``load_backbone(module=net, preprocess=Preprocess(...), dim=512)``,
    where ``net(pixels: (B, 3, H, W)) -> (B, dim)``.

    >>> bb = load_backbone("offline:dinov2-vits14", pooling="cls")  # doctest: +SKIP
    >>> bb.dim
    384
    """
    if module is not None:
        if id is not None or preprocess is None or dim is None:
            raise ValueError("to wrap your own module pass module=, preprocess= and dim= (and no id).")
        return Backbone(module, lambda m, x: m(x), id=f"module:{type(module).__name__}", dim=dim,
                        preprocess=preprocess, description="user module", options=options).freeze()
    if id is None:
        raise ValueError("load_backbone needs an id such as 'offline:dinov2-vits14' or 'hf:facebook/dinov2-small'.")
    try:
        prefix, ref = split_prefixed(id, BACKBONES)
    except UnknownNameError as err:
        raise ValueError(f"backbone id {id!r}: {err}") from None
    return BACKBONES.get(prefix)(ref, **options).freeze()


__all__ = ["Backbone", "BackboneNotFoundError", "Preprocess", "load_backbone"]
