"""What a probe receives and returns: `TapData` (everything one tap offers), `ProbeOutput` (flat metrics, the
protocol that produced them and per-unit values for intervals) and `MissingInputError`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a declaration imports this module; torch loads only when a probe runs
    import torch

    from headprobe.stats.bootstrap import PerUnit, SpreadRatio


@dataclass
class TapData:
    """What one tap offers. Shapes: train_x (N, D), test_x (M, D), views (N_v, K, D) with
    view_params (N_v, K, P), rotated_train_x (4N', D) with rotated_train_y in {0,1,2,3},
    orbits {sweep: (N_o, T, D)} (test images along each augmentation sweep) with orbit_labels (N_o,) their
    classes (the same images in every sweep). In a run the features (x, views, orbits) are `features.rows.TapRows`,
    read by rows, for a probe that reads in chunks, and whole float32 tensors for one that reads whole
    (`whole`); labels and parameters are tensors."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    n_classes: int
    seed: int = 0
    val_fraction: float = 0.2
    views: torch.Tensor | None = None
    view_params: torch.Tensor | None = None
    rotated_train_x: torch.Tensor | None = None
    rotated_train_y: torch.Tensor | None = None
    rotated_test_x: torch.Tensor | None = None
    rotated_test_y: torch.Tensor | None = None
    orbits: dict[str, torch.Tensor] | None = None
    orbit_labels: torch.Tensor | None = None
    # Augmentation parameters that vary in view_params but cannot change these images, with the reason
    # (e.g. {"hue": "grey images"}): augment_r2 reports them as skipped instead of scoring them.
    inert_params: dict[str, str] | None = None

    def to(self, device: torch.device | str) -> TapData:
        """The same tap with every tensor on `device` (the run's accelerator, where the probes then run); a new
        TapData, this one is left as it is. Labels and parameters move too, so no probe mixes devices."""
        import torch

        from headprobe.features.rows import TapRows

        moved = {name: value.to(device) for name, value in vars(self).items()
                 if isinstance(value, torch.Tensor | TapRows)}
        if self.orbits is not None:
            moved["orbits"] = {sweep: traj.to(device) for sweep, traj in self.orbits.items()}
        return dataclasses.replace(self, **moved)

    def whole(self, needs: tuple[str, ...] = ()) -> TapData:
        """The same tap for a probe that reads it whole: train_x, test_x and the inputs it `needs` (views, rotated,
        orbits) as whole float32 tensors (`features.rows.materialise`), the others as they are (read by rows); a
        new TapData, computed for that probe. A tap already whole is returned as it is."""
        from headprobe.features.rows import materialise

        fields = ["train_x", "test_x"] + (["views"] if "views" in needs else []) + (
            ["rotated_train_x", "rotated_test_x"] if "rotated" in needs else [])
        whole = {name: materialise(getattr(self, name)) for name in fields}
        if "orbits" in needs and self.orbits is not None:
            whole["orbits"] = {sweep: materialise(traj) for sweep, traj in self.orbits.items()}
        return dataclasses.replace(self, **whole)


@dataclass
class ProbeOutput:
    """metrics and how they were obtained; per_unit: for metrics that are means over units (test images, images
    with views), the per-unit values whose mean is the metric, so intervals and paired comparisons between taps
    need no refit (`headprobe.stats.bootstrap`)."""

    metrics: dict[str, float]
    protocol: dict = field(default_factory=dict)
    per_unit: dict[str, PerUnit | SpreadRatio] = field(default_factory=dict)


class MissingInputError(ValueError):
    """A probe asked for data this run does not produce; the message says which recipe key adds it."""


def need_views(tap: TapData, probe: str) -> torch.Tensor:
    """The tap's augmented-view features, or a `MissingInputError` saying the recipe needs heads for them."""
    if tap.views is None:
        raise MissingInputError(
            f"probe {probe!r} measures augmented views, which exist only when the recipe trains heads "
            "(add a `heads:` section) — or remove probes." + probe + "."
        )
    return tap.views
