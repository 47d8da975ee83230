"""The modules of the null heads (`headprobe.recipe.null_heads`): a fixed random injective map, and each trained
head's copy at its initialisation, built for one training seed."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from headprobe.recipe.null_heads import is_null
from headprobe.train.engine import build_head


@dataclass
class NullHead:
    """A null head of one seed: its module (eval mode, no gradients), never trained."""

    head: Any
    status: str
    predictor: Any = None
    last_loss: float | None = None
    message: str = ""


class RandomInjectiveMap(nn.Module):
    """x: (B, in_dim) → (B, max(width, in_dim)), x ↦ W x with W Gaussian N(0, 1/in_dim), fixed (no gradient).

    A Gaussian matrix with at least as many rows as columns has full column rank with probability one, so the map
    is injective: it loses nothing, and any information probe that moves under it is not measuring the head.
    The width is raised to in_dim where the recipe's width is smaller, because a narrower map cannot be injective.
    """

    def __init__(self, in_dim: int, width: int) -> None:
        super().__init__()
        self.in_dim, self.out_dim = in_dim, max(width, in_dim)
        self.map = nn.Linear(in_dim, self.out_dim, bias=False)
        with torch.no_grad():
            self.map.weight.normal_(0.0, 1.0 / math.sqrt(in_dim))
        self.map.weight.requires_grad_(False)

    depth = 1

    def taps(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [self.map(x)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.map(x)


def random_map(in_dim: int, spec) -> RandomInjectiveMap:
    """The HEADS registry's builder for `type: random`."""
    return RandomInjectiveMap(in_dim, spec.out_dim or spec.width)


def build_null_heads(specs, in_dim: int, seed: int) -> dict[str, NullHead]:
    """{name: NullHead} of every null head in `specs` for one training seed: an `init_of` copy gets the weights
    its twin was built with at this seed, a random map its own draw from (seed, name); both in eval mode."""

    by_name = {s.name: s for s in specs}
    out = {}
    for spec in (s for s in specs if is_null(s)):
        if spec.init_of is not None:
            head, _ = build_head(by_name[spec.init_of], in_dim, seed)
            status = f"untrained: {spec.init_of} at its initialisation (null)"
        else:
            head, _ = build_head(spec, in_dim, seed)
            status = "untrained: a fixed random injective linear map (null)"
        head.eval()
        for p in head.parameters():
            p.requires_grad_(False)
        out[spec.name] = NullHead(head, status)
    return out
