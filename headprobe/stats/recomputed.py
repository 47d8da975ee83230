"""Statistics that are not means over their units, written as functions of the units' bootstrap weights, so that
one product with the shared resampling weights (`stats.Resamples.weights`, (n_boot, n), rows summing to 1)
recomputes them on every resample at once.

A `Recomputed` statistic is one of a few formulas over per-unit tensors, or the ratio of two:

    mean            Σ_i w_i v_i                                      (values: (n,))
    pair_mean       Σ_{i≠j} w_i w_j A_ij / Σ_{i≠j} w_i w_j           (pairs: (n, n)), the mean over pairs of two
                    *different* units: a unit drawn twice is never paired with itself, so duplicates in a
                    resample drawn with replacement do not pull a between-unit mean towards the diagonal
    class_distance  mean_{c≠c'} ‖ν_c − ν_c'‖, ν_c = Σ_{i∈c} w_i μ_i / Σ_{i∈c} w_i   (centroids μ: (n, D),
                    classes: (n,)); with class-stratified resamples every class keeps its images
    "A/B"           statistic A divided by statistic B (tensors of A prefixed "0.", of B "1.")

At uniform weights 1/n each is the probe's own number (`value`), and the bootstrap replicates come from the same
formula under each resample's weights (`replicates`).

>>> pairs = torch.tensor([[0.0, 1.0, 2.0], [1.0, 0.0, 3.0], [2.0, 3.0, 0.0]])
>>> round(Recomputed("pair_mean", {"pairs": pairs}, "orbit images").value(), 12)  # (1 + 2 + 3) / 3
2.0
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = ["KINDS", "Recomputed", "ratio"]


def _mean(t: dict[str, torch.Tensor], w: torch.Tensor) -> torch.Tensor:
    return w @ t["values"].double()


def _pair_mean(t: dict[str, torch.Tensor], w: torch.Tensor) -> torch.Tensor:
    a = t["pairs"].double()
    both = ((w @ a) * w).sum(dim=1) - w.square() @ a.diagonal()
    return both / (w.sum(dim=1).square() - w.square().sum(dim=1))


def _class_distance(t: dict[str, torch.Tensor], w: torch.Tensor) -> torch.Tensor:
    mu = t["centroids"].double()
    mu = mu - mu.mean(dim=0)  # distances do not move; the Gram below loses no digits to a large common mean
    classes = t["classes"].long()
    onehot = torch.nn.functional.one_hot(classes, int(classes.max()) + 1).double()
    onehot = onehot[:, onehot.sum(dim=0) > 0]
    k = onehot.shape[1]
    member = w[:, :, None] * onehot  # (B, n, K)
    mass = member.sum(dim=1)  # (B, K)
    # ν_c · ν_c' from the images' Gram matrix: (n, n) @ (B, n, K), then (B, K, n) @ (B, n, K).
    cross = member.transpose(1, 2) @ ((mu @ mu.T) @ member) / (mass[:, :, None] * mass[:, None, :])
    own = cross.diagonal(dim1=1, dim2=2)
    distances = (own[:, :, None] + own[:, None, :] - 2 * cross).clamp_min(0).sqrt()
    return distances.sum(dim=(1, 2)) / (k * (k - 1))


KINDS: dict[str, Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor]] = {
    "mean": _mean, "pair_mean": _pair_mean, "class_distance": _class_distance,
}


def _evaluate(kind: str, tensors: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
    if "/" in kind:
        top, bottom = kind.split("/")
        part = {i: {name[2:]: t for name, t in tensors.items() if name.startswith(f"{i}.")} for i in "01"}
        return KINDS[top](part["0"], weights) / KINDS[bottom](part["1"], weights)
    return KINDS[kind](tensors, weights)


@dataclass
class Recomputed:
    """kind: a `KINDS` name or "A/B"; tensors: its per-unit inputs (first dimension n, the units); unit: what was
    sampled (paired only with resamples of the same units); how: the method sentence of its interval."""

    kind: str
    tensors: dict[str, torch.Tensor]
    unit: str
    how: str = "the statistic recomputed on each resample"
    # The basic bootstrap interval [2θ̂ − q_97.5, 2θ̂ − q_2.5] instead of the percentile one, for a statistic that
    # its resamples push the same way as sampling pushes the estimate (a distance between few images' centroids:
    # noise in a centroid only lengthens it); the percentile interval then sits beside the truth.
    reflect: bool = False
    # The last resamples' replicates (d_inter's are reused by d_ratio), and a ratio's two statistics.
    _last: tuple = field(default=(None, None), repr=False, compare=False)
    _parts: tuple | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        unknown = [k for k in self.kind.split("/") if k not in KINDS]
        if unknown or self.kind.count("/") > 1:
            raise ValueError(f"statistic kind {self.kind!r} is unknown; use one of {', '.join(KINDS)} or 'A/B'.")
        sizes = {t.shape[0] for t in self.tensors.values()}
        if len(sizes) != 1:
            raise ValueError(f"the tensors of a {self.kind!r} statistic describe different numbers of units: "
                             f"{sorted(sizes)}; give every tensor one row per unit.")

    @property
    def n(self) -> int:
        return next(iter(self.tensors.values())).shape[0]

    def value(self) -> float:
        return float(_evaluate(self.kind, self.tensors, torch.full((1, self.n), 1.0 / self.n,
                                                                   dtype=torch.float64))[0])

    def replicates(self, resamples) -> torch.Tensor:
        """(n_boot,) float64: the statistic under each resample's weights (`stats.Resamples`)."""
        if self.n != resamples.shape[1]:
            raise ValueError(f"the statistic has {self.n} {self.unit} but the resamples draw from "
                             f"{resamples.shape[1]}; pair statistics and resamples of the same units.")
        if self._last[0] is not resamples:
            if self._parts is not None:
                boot = self._parts[0].replicates(resamples) / self._parts[1].replicates(resamples)
            else:
                boot = _evaluate(self.kind, self.tensors, resamples.weights)
            self._last = (resamples, boot)
        return self._last[1]


def ratio(top: Recomputed, bottom: Recomputed, how: str | None = None) -> Recomputed:
    """top / bottom, recomputed on each resample from both (of the same units); reflected if either is."""
    if top.unit != bottom.unit or "/" in top.kind or "/" in bottom.kind:
        raise ValueError("a ratio divides two plain statistics of the same units.")
    tensors = {f"0.{k}": v for k, v in top.tensors.items()} | {f"1.{k}": v for k, v in bottom.tensors.items()}
    return Recomputed(f"{top.kind}/{bottom.kind}", tensors, top.unit, how or "the ratio recomputed on each resample",
                      top.reflect or bottom.reflect, _parts=(top, bottom))
