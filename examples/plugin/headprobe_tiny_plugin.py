"""A headprobe plug-in (see pyproject.toml next to it): a backbone, an objective and a probe from outside headprobe.

- `load_tinycnn(ref, *, seed=0)`: ``backbone.id: tinycnn:<width>``, a small randomly initialised CNN returned as a
  bare module, so headprobe applies its contract (ImageNet mean and std, `backbone.resolution` px, default 224).
- `align_uniform(z1, z2, t=2.0)`: Wang & Isola's alignment + uniformity objective.
- `CENTROID`: a probe declared the way headprobe's own probes are (`headprobe.probes.declaration.Probe`): test
  accuracy of the nearest class mean, with its per-image values (for intervals) and its metric's declaration, which
  the glossary, the report and the buffer verdict read (`centroid.acc` is evidence, like `knn.k20.acc`).

Torch is imported inside the functions, so that `headprobe list` and `validate` read the declaration without it.
"""

from __future__ import annotations

from headprobe.probes.declaration import CLASS_CHANCE, INFORMATION, Metric, Probe


def load_tinycnn(ref: str, *, seed: int = 0):
    """``tinycnn:<width>`` (default 16): conv 3x3 stride 2 → ReLU → conv 3x3 stride 2 → global mean; (B, width)."""
    from torch import nn

    width = int(ref or 16)
    return nn.Sequential(nn.Conv2d(3, width, 3, stride=2), nn.ReLU(), nn.Conv2d(width, width, 3, stride=2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten())


def align_uniform(z1, z2, t: float = 2.0):
    """"We [...] directly optimize for these two properties" (Wang & Isola, 2020): alignment of positive pairs,
    E‖f(x) − f(y)‖², plus uniformity, log E exp(−t‖f(x) − f(y)‖²) over all pairs, on L2-normalised outputs."""
    import torch
    from torch import nn

    from headprobe.train.objectives import LossTerms

    z1, z2 = nn.functional.normalize(z1, dim=1), nn.functional.normalize(z2, dim=1)
    align = (z1 - z2).pow(2).sum(1).mean()
    z = torch.cat([z1, z2])
    uniform = torch.pdist(z).pow(2).mul(-t).exp().mean().log()
    loss = align + uniform
    return LossTerms(loss, {"align_uniform": loss, "align_uniform.align": align, "align_uniform.uniform": uniform})


def centroid(tap):
    """Accuracy of the nearest class mean of the training features, with each test image's correctness."""
    import torch

    from headprobe.probes.tap_data import ProbeOutput
    from headprobe.stats.bootstrap import TEST_IMAGES, PerUnit

    means = torch.stack([tap.train_x[tap.train_y == c].mean(0) for c in range(tap.n_classes)])
    correct = (torch.cdist(tap.test_x.float(), means.float()).argmin(1) == tap.test_y).double()
    return ProbeOutput({"centroid.acc": float(correct.mean())}, {}, {"centroid.acc": PerUnit(correct, TEST_IMAGES)})


CENTROID = Probe(
    "centroid", centroid, "nearest class mean (the example plug-in)",
    metrics=(Metric("centroid.acc", "test accuracy of the nearest class mean of the training features",
                    "fraction of test images", "higher = more class information", CLASS_CHANCE,
                    role=INFORMATION, predicted=-1),),
)


def register(registries) -> None:
    """Called once by headprobe with its registries by family name (`headprobe.registry.FAMILIES`): the probe's
    declaration, read when a recipe, `headprobe list` or the report first asks for it."""
    registries["probes"].declare("centroid", f"{__name__}:CENTROID")
