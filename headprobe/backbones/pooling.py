"""Poolings: (B, T, D) tokens or (B, C, H, W) feature maps → (B, D') features, and which apply where.

`n_prefix` is the number of non-patch tokens at the start of the sequence
(the class token plus any register tokens). `pooler` is not computed here: it
is the model's own pooled output (CLIP's post-normed class token, SigLIP's
attention-pooling head, timm's `forward_head`, open_clip's projected embedding).
"""

from __future__ import annotations

import torch

POOL_WIDTH = {"cls": 1, "mean": 1, "cls+mean": 2, "pooler": 1}
# layer: -1 always means the final features (after the final norm, or a CNN's head convolution).
FINAL = -1


def pool_cls(tokens: torch.Tensor, n_prefix: int) -> torch.Tensor:
    """tokens: (B, T, D) → (B, D), the class token."""
    if n_prefix < 1:
        raise ValueError("this model has no class token; use pooling 'mean'.")
    return tokens[:, 0]


def pool_mean(tokens: torch.Tensor, n_prefix: int) -> torch.Tensor:
    """tokens: (B, T, D) → (B, D), mean over patch tokens (class and register tokens excluded)."""
    return tokens[:, n_prefix:].mean(dim=1)


def pool_cls_mean(tokens: torch.Tensor, n_prefix: int) -> torch.Tensor:
    """tokens: (B, T, D) → (B, 2D), [class token, patch mean] as in DINOv2's linear evaluation."""
    return torch.cat([pool_cls(tokens, n_prefix), pool_mean(tokens, n_prefix)], dim=-1)


def pool_map_mean(fmap: torch.Tensor) -> torch.Tensor:
    """fmap: (B, C, H, W) → (B, C), global average pooling."""
    return fmap.mean(dim=(-2, -1))


def supported_poolings(*, tokens: bool, has_cls: bool, has_pooler: bool) -> list[str]:
    if tokens:
        names = ["cls", "mean", "cls+mean"] if has_cls else ["mean"]
    else:
        names = ["mean"]
    return names + (["pooler"] if has_pooler else [])


def check_pooling(id: str, pooling: str, *, tokens: bool, has_cls: bool, has_pooler: bool, final_only: bool) -> None:
    """Raise a sentence naming the supported poolings when `pooling` cannot be computed for this model."""
    allowed = supported_poolings(tokens=tokens, has_cls=has_cls, has_pooler=has_pooler)
    if pooling not in POOL_WIDTH:
        raise ValueError(f"{id}: unknown pooling {pooling!r}; supported here: {', '.join(allowed)}.")
    if pooling in allowed:
        if pooling == "pooler" and not final_only:
            raise ValueError(f"{id}: pooling 'pooler' is the model's own head on its final features, so it cannot "
                             f"be combined with layer/layers; use one of {', '.join(allowed[:-1])} for other layers.")
        return
    if not tokens:
        why = "is a CNN (its features are a feature map, not tokens), so it has no class token"
    elif pooling == "pooler":
        why = "has no pooled output of its own"
    else:
        why = "has no class token"
    raise ValueError(f"{id} {why}: pooling {pooling!r} is undefined; supported poolings: {', '.join(allowed)}.")


def resolve_layers(id: str, layer: int, layers: list[int] | None, n_blocks: int) -> list[int]:
    """`layer` / `layers` → picks: `FINAL` or a block index in [0, n_blocks), in the order given.

    -1 is the final features; any other index i is the output of `blocks[i]` (negative counts from the end).
    """
    if layers is not None:
        if layer != FINAL:
            raise ValueError(f"{id}: give either layer ({layer}) or layers ({layers}), not both.")
        if not layers:
            raise ValueError(f"{id}: layers is empty; give block indices such as [-4, -1].")
        chosen = list(layers)
    else:
        chosen = [layer]
    picks = []
    for i in chosen:
        if i == FINAL:
            picks.append(FINAL)
            continue
        if not -n_blocks <= i < n_blocks:
            span = f"-{n_blocks}..{n_blocks - 1}" if n_blocks else "only -1 (the final features)"
            raise ValueError(f"{id}: layer {i} is out of range; this model has {n_blocks} blocks, so use {span}.")
        picks.append(i % n_blocks)
    if len(set(picks)) != len(picks):
        raise ValueError(f"{id}: layers {chosen} name the same block twice.")
    return picks


def pooled_output(outputs) -> torch.Tensor:
    """A transformers model output → its own `pooler_output` (B, D)."""
    if getattr(outputs, "pooler_output", None) is None:
        raise ValueError("this model returned no pooler_output; use pooling 'cls' or 'mean'.")
    return outputs.pooler_output
