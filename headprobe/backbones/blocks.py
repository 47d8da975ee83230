"""Features read from any block of a model through forward hooks (timm, open_clip, scratch, offline CNNs).

One forward pass of the model's own `run` function; hooks keep the outputs of
the chosen blocks. Transformer tokens pass through the model's final norm
before pooling (DINOv2's `get_intermediate_layers(norm=True)` convention), so
layer -1 equals the model's own final features; CNN feature maps are averaged
over space, and layer -1 of a CNN is its final feature map (after any head
convolution that follows the last block).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from functools import partial

import torch
from torch import nn

from ..registry import POOLINGS
from .base import Backbone, Preprocess
from .pooling import FINAL, check_pooling, pool_map_mean, resolve_layers


@contextlib.contextmanager
def block_outputs(blocks: list[nn.Module], indices: list[int]) -> Iterator[dict[int, torch.Tensor]]:
    """Within the block, `outs[i]` is the output of `blocks[i]` from the forward pass that ran inside it."""
    outs: dict[int, torch.Tensor] = {}

    def keep(i: int, _module, _inputs, output) -> None:
        outs[i] = output[0] if isinstance(output, tuple) else output

    handles = [blocks[i].register_forward_hook(partial(keep, i)) for i in sorted(set(indices))]
    try:
        yield outs
    finally:
        for h in handles:
            h.remove()


def encode_blocks(
    model: nn.Module,
    pixels: torch.Tensor,
    *,
    run: Callable[[nn.Module, torch.Tensor], torch.Tensor],
    blocks: list[nn.Module],
    picks: list[int],
    tokens: bool,
    norm: nn.Module | None,
    n_prefix: int,
    pool: Callable | None,
    pooler: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None,
) -> torch.Tensor:
    """pixels: (B, 3, H, W) → (B, D'): the pooled features of each pick, concatenated in order."""
    if pooler is not None:
        return pooler(model, pixels)
    last = len(blocks) - 1
    hooked = [last if (p == FINAL and tokens) else p for p in picks if p != FINAL or tokens]
    with block_outputs(blocks, hooked) as outs:
        final = run(model, pixels)
    feats = []
    for p in picks:
        if tokens:
            x = outs[last if p == FINAL else p]
            feats.append(pool(norm(x) if norm is not None else x, n_prefix))
        else:
            feats.append(pool_map_mean(final if p == FINAL else outs[p]))
    return torch.cat(feats, dim=-1)


def wrap_blocks(
    model: nn.Module,
    *,
    id: str,
    run: Callable[[nn.Module, torch.Tensor], torch.Tensor],
    blocks: list[nn.Module],
    tokens: bool,
    pooling: str,
    layer: int,
    layers: list[int] | None,
    preprocess: Preprocess,
    description: str,
    options: dict,
    norm: nn.Module | None = None,
    n_prefix: int = 0,
    has_cls: bool | None = None,
    pooler: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None,
    after_blocks: list[nn.Module] | None = None,
) -> Backbone:
    """A `Backbone` whose features come from `run`'s forward pass; `.dim` is measured on one blank image.

    `tokens`: blocks output (B, T, D) tokens (ViT-style) rather than (B, C, H, W) maps (CNN).
    `n_prefix`: class and register tokens ahead of the patches; `has_cls`: whether the first is a class token
    (default: any prefix). `norm`: the final norm applied to every token layer. `after_blocks`: what `last:N`
    tuning unfreezes besides the blocks (default: `norm`; a CNN's head convolution).
    """
    picks = resolve_layers(id, layer, layers, len(blocks))
    if tokens and not blocks:
        raise ValueError(f"{id}: no transformer blocks were found, so its tokens cannot be read; use pooling: pooler.")
    has_cls = n_prefix > 0 if has_cls is None else has_cls
    check_pooling(id, pooling, tokens=tokens, has_cls=has_cls, has_pooler=pooler is not None,
                  final_only=picks == [FINAL])
    encode = partial(
        encode_blocks, run=run, blocks=blocks, picks=picks, tokens=tokens, norm=norm, n_prefix=n_prefix,
        pool=POOLINGS.get(pooling) if tokens and pooling != "pooler" else None,
        pooler=pooler if pooling == "pooler" else None,
    )
    model.eval()
    with torch.no_grad():
        dim = encode(model, torch.zeros(1, 3, preprocess.crop, preprocess.crop)).shape[-1]
    if after_blocks is None:
        after_blocks = [norm] if norm is not None else []
    return Backbone(model, encode, id=id, dim=dim, preprocess=preprocess, blocks=blocks, description=description,
                    options=options, norm=after_blocks)
