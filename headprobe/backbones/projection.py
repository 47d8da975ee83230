"""A vision-language model's own image projection as a `type: pretrained` head: "probe before or after CLIP's
projection?" answered with the same questions as a self-supervised checkpoint's head.

CLIP-family backbones bring their head with them: the linear map from the vision tower's pooled features to the
joint image-text space (transformers' `CLIPVisionModelWithProjection.visual_projection`, open_clip's `visual.proj`).
`load_image_projection` reads it with the library that wrote the checkpoint (transformers, open_clip: the same
loaders as the backbone, the same seed for an untagged open_clip architecture), so the head's output equals the
library's own image embedding on the features headprobe taps (tested on tiny models saved by each library).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch
from torch import nn

from . import load_backbone
from .from_open_clip import open_clip_image_projection
from .hf import load_hf_image_projection

__all__ = ["ImageProjection", "ProjectionRecord", "load_image_projection", "projection_expects"]


@dataclass
class ProjectionRecord:
    """What was read, from where (`results.json` → `heads.H.checkpoint`)."""

    id: str
    library: str
    source: str
    shape: list[int]
    sha256: str
    expects: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"id": self.id, "format": f"{self.library} image projection", "library": self.library,
                "source": self.source, "shape": list(self.shape), "sha256": self.sha256,
                "expects": dict(self.expects)}


class ImageProjection(nn.Module):
    """`x @ weight.T (+ bias)`: one layer, one tap (`projection`); frozen, in eval mode, never trained."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, record: ProjectionRecord) -> None:
        super().__init__()
        self.linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
        with torch.no_grad():
            self.linear.weight.copy_(weight)
            if bias is not None:
                self.linear.bias.copy_(bias)
        self.in_dim, self.out_dim = weight.shape[1], weight.shape[0]
        self.tap_labels = ["projection"]
        self.record = record
        self.expects = dict(record.expects)
        self.eval()
        for p in self.parameters():
            p.requires_grad_(False)

    @property
    def depth(self) -> int:
        return 1

    def taps(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [self.forward(x)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def _digest(weight: torch.Tensor) -> str:
    return hashlib.sha256(weight.detach().to(torch.float32).contiguous().numpy().tobytes()).hexdigest()


def projection_expects(id: str) -> bool:
    """Whether backbone `id` is of a library whose checkpoints may hold an image projection (hf:, open_clip:)."""
    return id.startswith(("hf:", "open_clip:"))


def load_image_projection(id: str, *, seed: int = 0, revision: str | None = None,
                          resolution: int | None = None) -> ImageProjection:
    """The image projection of backbone `id` (`hf:<CLIP checkpoint>` or `open_clip:<arch>[/<weights>]`) as a frozen
    one-layer head; `expects` says which backbone features it takes (pooling, final layer). `seed` and `resolution`
    as the backbone's: an untagged open_clip architecture is initialised from them, so its projection is the
    backbone's own."""
    if id.startswith("hf:"):

        linear = load_hf_image_projection(id[3:], revision)
        weight, bias = linear.weight.detach(), (linear.bias.detach() if linear.bias is not None else None)
        expects = {"pooling": ["cls", "pooler"], "layer": -1}
        record = ProjectionRecord(id, "transformers", "CLIPVisionModelWithProjection.visual_projection",
                                  list(weight.shape), _digest(weight), expects)
        return ImageProjection(weight, bias, record)
    if id.startswith("open_clip:"):

        # The backbone's own loader and seed: an untagged architecture's random projection is the backbone's.
        visual = load_backbone(id, pooling="pooler", resolution=resolution, seed=seed).model
        proj, pooling = open_clip_image_projection(visual, id)
        weight = proj.t().contiguous()
        expects = {"pooling": [pooling], "layer": -1}
        record = ProjectionRecord(id, "open_clip", "visual.proj", list(weight.shape), _digest(weight), expects)
        return ImageProjection(weight, None, record)
    raise ValueError(f"backbone {id}: only hf: (CLIP) and open_clip: backbones bring an image projection; a "
                     "`type: pretrained` head otherwise needs backbone.id: ssl:<format>:<path>.")
