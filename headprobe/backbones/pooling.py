"""Token poolings: (B, T, D) hidden states → (B, D') features.

`n_prefix` is the number of non-patch tokens at the start of the sequence
(the class token plus any register tokens).
"""

from __future__ import annotations

import torch


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


POOL_WIDTH = {"cls": 1, "mean": 1, "cls+mean": 2}
