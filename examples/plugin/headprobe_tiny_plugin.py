"""A headprobe plug-in (see pyproject.toml next to it): a backbone, an objective and a probe from outside headprobe.

- `load_tinycnn(ref, *, seed=0)`: ``backbone.id: tinycnn:<width>``, a small randomly initialised CNN returned as a
  bare module, so headprobe applies its contract (ImageNet mean and std, `backbone.resolution` px, default 224).
- `align_uniform(z1, z2, t=2.0)`: Wang & Isola's alignment + uniformity objective.
- `centroid`: test accuracy of the nearest class mean, registered with its per-image values (for intervals).
"""

from __future__ import annotations

import torch
from torch import nn


def load_tinycnn(ref: str, *, seed: int = 0) -> nn.Module:
    """``tinycnn:<width>`` (default 16): conv 3x3 stride 2 → ReLU → conv 3x3 stride 2 → global mean; (B, width)."""
    width = int(ref or 16)
    return nn.Sequential(nn.Conv2d(3, width, 3, stride=2), nn.ReLU(), nn.Conv2d(width, width, 3, stride=2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten())


def align_uniform(z1: torch.Tensor, z2: torch.Tensor, t: float = 2.0):
    """"We [...] directly optimize for these two properties" (Wang & Isola, 2020): alignment of positive pairs,
    E‖f(x) − f(y)‖², plus uniformity, log E exp(−t‖f(x) − f(y)‖²) over all pairs, on L2-normalised outputs."""
    from headprobe.train.objectives import LossTerms

    z1, z2 = nn.functional.normalize(z1, dim=1), nn.functional.normalize(z2, dim=1)
    align = (z1 - z2).pow(2).sum(1).mean()
    z = torch.cat([z1, z2])
    uniform = torch.pdist(z).pow(2).mul(-t).exp().mean().log()
    loss = align + uniform
    return LossTerms(loss, {"align_uniform": loss, "align_uniform.align": align, "align_uniform.uniform": uniform})


def centroid(tap):
    """Accuracy of the nearest class mean of the training features, with each test image's correctness."""
    from headprobe.probes.tap_data import ProbeOutput
    from headprobe.stats.bootstrap import TEST_IMAGES, PerUnit

    means = torch.stack([tap.train_x[tap.train_y == c].mean(0) for c in range(tap.n_classes)])
    correct = (torch.cdist(tap.test_x.float(), means.float()).argmin(1) == tap.test_y).double()
    return ProbeOutput({"centroid.acc": float(correct.mean())}, {}, {"centroid.acc": PerUnit(correct, TEST_IMAGES)})


def register(registries) -> None:
    """Called once by headprobe with its registries by family name (`headprobe.registry.FAMILIES`)."""
    registries["probes"].add("centroid", f"{__name__}:centroid", "nearest class mean (the example plug-in)")
