"""Uncertainty for probe metrics: paired, stratified bootstrap intervals and a Holm-corrected verdict test.

A metric that is a mean over units (test images, images with views, orbits) carries its per-unit values
(`PerUnit`); one set of bootstrap resamples of those units is drawn per run and unit kind and shared by every tap,
so the backbone and a head are compared on the same resampled images (a *paired* bootstrap: the margin's
interval is far narrower than two independent intervals would suggest when the taps err on the same images).
Resampling is stratified by class where the units have labels, which keeps each class's count fixed as the
stratified test split does (Efron & Tibshirani 1993, §6.9).

The interval is the percentile interval of the resampled means; a margin is *resolved* when its two-sided
bootstrap p-value stays below α after Holm's step-down correction over the pieces of evidence of one head
(Holm 1979), i.e. when the simultaneous interval excludes 0.

Why not `scipy.stats.bootstrap`: it draws its own resamples in every call, so taps are paired only when passed
together, and it has no strata. At the quickstart's shapes (80 intervals: 7 taps × 8 metrics and 3 heads' paired
margins, 450 images, 2,000 resamples) the shared resamples took 1/19 of scipy's time, one call per interval, for
intervals whose endpoints agree within 0.05 of their width (`benchmarks/bench_bootstrap.py`,
`benchmarks/results/bootstrap.json`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from headprobe.parallel.atomic import replace_atomically
from headprobe.stats.recomputed import Recomputed

# Enough resamples that the smallest attainable two-sided p-value, 2 / (B + 1) ≈ 0.001, survives a Holm
# correction over ~20 pieces of evidence at α = 0.05.
N_BOOT = 2000
ALPHA = 0.05
# The kinds of unit a per-unit metric averages over; resamples of one kind are shared by every tap.
TEST_IMAGES = "test images"
VIEW_IMAGES = "images with views"
ORBIT_IMAGES = "orbit images"
TRAIN_IMAGES = "training images"


@dataclass
class PerUnit:
    """values: (n,) float64 per-unit contributions whose mean is the metric; unit names what was sampled
    (e.g. "test images"), so two taps' values pair up only over the same units."""

    values: torch.Tensor
    unit: str

    def value(self) -> float:
        return float(self.values.double().mean())

    def replicates(self, resamples: Resamples) -> torch.Tensor:
        return resampled_means(self.values, resamples)


class Linearised(PerUnit):
    """Per-unit pseudo-values of a smooth statistic that is not a mean (the statistic plus each unit's influence,
    e.g. `probes.lidar_influence`): their mean is the statistic, and their bootstrap is the delta-method
    (linearised) bootstrap, valid to first order where recomputing the statistic per resample costs too much."""


class OfWeights:
    """A statistic written as a function of the units' resampling weights (`of_weights`: (B, n) → (B,)): its value
    at uniform weights 1/n, its bootstrap replicates under the resamples' weights. Subclasses give `n_units`, the
    function and `what` (for the message when statistic and resamples have different units)."""

    what = "the statistic"

    def n_units(self) -> int:
        raise NotImplementedError

    def of_weights(self, weights: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def value(self) -> float:
        n = self.n_units()
        return float(self.of_weights(torch.full((1, n), 1.0 / n, dtype=torch.float64))[0])

    def replicates(self, resamples: Resamples) -> torch.Tensor:
        if self.n_units() != resamples.shape[1]:
            raise ValueError(f"{self.what} has {self.n_units()} images but the resamples draw from "
                             f"{resamples.shape[1]}; pair statistics and resamples of the same units.")
        return self.of_weights(resamples.weights)


@dataclass
class SpreadRatio(OfWeights):
    """The orbit spread relative to the space's scale (`probes.orbits`: spread_rel = S / (2n/(n−1)·C + 2S)) as a
    function of which orbit images are drawn: S = Σ w_i s_i (s_i: image i's mean squared distance to its orbit
    centroid μ_i), C = Σ w_i ‖μ_i‖² − ‖Σ w_i μ_i‖² (the centroids' scatter), with resampling weights w. Not a mean,
    so it is bootstrapped by recomputing the ratio on each resample of the orbit images."""

    spread: torch.Tensor  # (n,)
    centroids: torch.Tensor  # (n, D)
    unit: str
    what = "the orbit statistic"

    def n_units(self) -> int:
        return self.spread.shape[0]

    def of_weights(self, weights: torch.Tensor) -> torch.Tensor:
        n = self.spread.shape[0]
        s = weights @ self.spread.double()
        mean = weights @ self.centroids.double()
        scatter = weights @ self.centroids.double().square().sum(dim=1) - mean.square().sum(dim=-1)
        return s / (2 * n / (n - 1) * scatter + 2 * s)


@dataclass
class Uniformity(OfWeights):
    """Uniformity log E_{i≠j} exp(−t ‖z_i − z_j‖²) (`probes.view_geometry.uniformity`) as a function of which images
    are drawn: points (n, D) on the unit sphere (`view_geometry.sphere_points`). Under resampling weights w the mean
    runs over pairs of two different images, Σ_{i≠j} w_i w_j k_ij / Σ_{i≠j} w_i w_j (an image drawn twice is not
    a pair with itself, whose kernel would be 1). Not a mean, so it is bootstrapped by recomputing it on each
    resample; the kernel matrix is rebuilt in row blocks, so memory stays O(block · n) and time O(n_boot · n²)."""

    points: torch.Tensor  # (n, D), unit rows
    t: float
    unit: str
    block: int = 512
    what = "the uniformity"

    def n_units(self) -> int:
        return self.points.shape[0]

    def of_weights(self, weights: torch.Tensor) -> torch.Tensor:
        z = self.points.double()
        w = weights.to(z.device, torch.float64)
        total = torch.zeros(w.shape[0], dtype=torch.float64, device=z.device)
        for start in range(0, z.shape[0], self.block):
            rows = slice(start, start + self.block)
            kernel = torch.exp(-self.t * (2 - 2 * z[rows] @ z.T).clamp_min(0))
            kernel[:, start:start + self.block].fill_diagonal_(0.0)
            total += (w[:, rows] * (w @ kernel.T)).sum(dim=1)
        pairs = 1 - w.square().sum(dim=1)
        return (total / pairs).log().cpu()


class SeedMean:
    """The mean over seeds of a statistic that is recomputed on each resample (a spread ratio, the uniformity, a
    recomputed orbit measure): the seed-mean metric as a function of which units are drawn. Each seed's statistic is
    evaluated on the same resamples and the replicates are averaged, so its interval covers the test-set variation
    of the seed mean and pairs with the backbone's like any other statistic."""

    def __init__(self, parts: list, unit: str) -> None:
        self.parts, self.unit = parts, unit
        self.reflect = bool(getattr(parts[0], "reflect", False))
        self.how = f"the mean over {len(parts)} seeds of each seed's statistic recomputed on the same resamples"

    def value(self) -> float:
        return sum(p.value() for p in self.parts) / len(self.parts)

    def replicates(self, resamples: Resamples) -> torch.Tensor:
        return torch.stack([resamples.replicates_of(p) for p in self.parts]).mean(0)


class Resamples:
    """Bootstrap resamples of n units: `indices` (n_boot, n) int64, and `weights` (n_boot, n) float64, how often
    each unit is drawn divided by n, so the resampled means of any per-unit values v are one product weights @ v
    (computed once and shared by every metric and tap: far cheaper than gathering v[indices] per metric)."""

    def __init__(self, indices: torch.Tensor, stratified: bool = False) -> None:
        self.indices, self.stratified = indices, stratified  # stratified: drawn within classes
        self._weights: torch.Tensor | None = None
        self._replicates: dict[int, tuple[object, torch.Tensor]] = {}

    @property
    def shape(self) -> torch.Size:
        return self.indices.shape

    @property
    def weights(self) -> torch.Tensor:
        if self._weights is None:
            n_boot, n = self.indices.shape
            counts = torch.zeros(n_boot, n, dtype=torch.float64)
            counts.scatter_add_(1, self.indices, torch.ones(n_boot, n, dtype=torch.float64))
            self._weights = counts / n
        return self._weights

    def replicates_of(self, statistic) -> torch.Tensor:
        """statistic.replicates(self), computed once per statistic: the tap's interval and every head's paired
        verdict read the same replicates (the statistic is kept alive with them, so its id is not reused)."""
        key = id(statistic)
        if key not in self._replicates:
            self._replicates[key] = (statistic, statistic.replicates(self))
        return self._replicates[key][1]


def bootstrap_resamples(n: int, n_boot: int = N_BOOT, seed: int = 0, strata: torch.Tensor | None = None
                        ) -> Resamples:
    """n_boot resamples of n units drawn with replacement, within each stratum when `strata` (n,) is given (each
    stratum keeps its size). The same (n, n_boot, seed, strata) always gives the same indices."""
    if n < 1 or n_boot < 1:
        raise ValueError(f"a bootstrap needs n >= 1 units and n_boot >= 1 resamples, got n={n}, n_boot={n_boot}.")
    gen = torch.Generator().manual_seed(seed)
    if strata is None:
        return Resamples(torch.randint(n, (n_boot, n), generator=gen))
    strata = torch.as_tensor(strata).cpu()
    if strata.shape != (n,):
        raise ValueError(f"strata has shape {tuple(strata.shape)}; it needs one label per unit, ({n},).")
    out = torch.empty(n_boot, n, dtype=torch.long)
    for value in torch.unique(strata):
        members = (strata == value).nonzero().squeeze(1)
        picks = torch.randint(len(members), (n_boot, len(members)), generator=gen)
        out[:, members] = members[picks]
    return Resamples(out, stratified=True)


def resampled_means(values: torch.Tensor, resamples: Resamples) -> torch.Tensor:
    """values: (n,) per-unit values -> (n_boot,) float64 means of the resampled values."""
    values = values.detach().double().cpu()
    if values.ndim != 1 or values.shape[0] != resamples.shape[1]:
        raise ValueError(f"per-unit values have shape {tuple(values.shape)} but the resamples draw from "
                         f"{resamples.shape[1]} units; pair values and resamples of the same units.")
    return resamples.weights @ values


def percentile_interval(boot: torch.Tensor, level: float = 1 - ALPHA) -> list[float]:
    """The central `level` percentile interval [low, high] of bootstrap replicates boot: (n_boot,); of each row
    for boot (..., n_boot), as nested lists (..., 2)."""
    tail = (1 - level) / 2
    bounds = torch.quantile(boot.double(), torch.tensor([tail, 1 - tail], dtype=torch.float64), dim=-1)
    return bounds.movedim(0, -1).tolist()


def bootstrap_p_value(boot: torch.Tensor) -> float:
    """Two-sided p-value of "the statistic is 0" from its bootstrap replicates: twice the smaller tail mass on
    either side of 0, with the +1 correction that keeps it valid for a finite number of replicates."""
    n = boot.numel()
    below, above = int((boot <= 0).sum()), int((boot >= 0).sum())
    return min(1.0, 2 * (min(below, above) + 1) / (n + 1))


def holm(p_values: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values: the i-th smallest of m is multiplied by (m − i + 1), and adjusted
    values are made monotone. Reject (resolve) where the adjusted value is below α."""
    order = sorted(p_values, key=p_values.get)
    m, running, adjusted = len(order), 0.0, {}
    for i, name in enumerate(order):
        running = max(running, min(1.0, (m - i) * p_values[name]))
        adjusted[name] = running
    return adjusted


def interval(values: PerUnit | SpreadRatio | Uniformity, resamples: Resamples, method: str) -> dict:
    """The uncertainty record of one per-unit metric: {"ci95", "method", "n_boot", "n_units", "unit", "se"}."""
    boot = resamples.replicates_of(values)
    ci95 = percentile_interval(boot)
    if getattr(values, "reflect", False):  # the basic bootstrap interval (`recomputed.Recomputed.reflect`)
        estimate = values.value()
        ci95 = [2 * estimate - ci95[1], 2 * estimate - ci95[0]]
    return {"ci95": ci95, "method": method, "n_boot": int(resamples.shape[0]),
            "n_units": int(resamples.shape[1]), "unit": values.unit, "se": float(boot.std())}


def seed_interval(per_seed: list[float]) -> dict:
    """Mean ± t_{0.975, S−1} · sd / √S over S ≥ 2 seeds (Student t; the seeds are independent retrainings)."""
    from scipy.stats import t

    s = len(per_seed)
    values = torch.tensor(per_seed, dtype=torch.float64)
    sd = float(values.std()) if s > 1 else 0.0
    half = float(t.ppf(1 - ALPHA / 2, s - 1)) * sd / math.sqrt(s) if s > 1 else math.nan
    mean = float(values.mean())
    return {"ci95": [mean - half, mean + half] if s > 1 else None, "method": f"t interval over {s} seeds",
            "sd_seeds": sd, "n_seeds": s}


def n_units(statistic) -> int:
    """How many units a per-unit statistic (`PerUnit`, `SpreadRatio`, `Uniformity`, `Recomputed`) was measured on."""
    if isinstance(statistic, Recomputed):
        return statistic.n
    if isinstance(statistic, SeedMean):
        return n_units(statistic.parts[0])
    for name in ("values", "spread", "points"):
        if hasattr(statistic, name):
            return len(getattr(statistic, name))
    raise TypeError(f"{type(statistic).__name__} is not a per-unit statistic.")


def save_per_unit(path, per_unit: dict[str, PerUnit]) -> None:
    """Write per-unit values as safetensors (tensors and a str→str header only: nothing to unpickle), atomically,
    so a resumed run keeps the intervals of the taps it finished."""

    from safetensors.torch import save_file

    tensors, units = {}, {}
    for name, p in per_unit.items():
        if isinstance(p, SpreadRatio):
            tensors[f"{name}|spread"], tensors[f"{name}|centroids"] = p.spread, p.centroids
        elif isinstance(p, Uniformity):
            tensors[f"{name}|points"], tensors[f"{name}|t"] = p.points, torch.tensor([p.t])
        elif isinstance(p, Linearised):
            tensors[f"{name}|linearised"] = p.values
        elif isinstance(p, Recomputed):  # name|r|tensor, the kind in the header
            tensors |= {f"{name}|r|{k}": v for k, v in p.tensors.items()}
            units[f"{name}|kind"], units[f"{name}|how"] = p.kind, p.how
            units[f"{name}|reflect"] = "1" if p.reflect else ""
        else:
            tensors[name] = p.values
        units[name] = p.unit
    # One copy each: statistics share tensors in memory (an orbit's per-image spread and its ratio), which
    # safetensors refuses to write.
    tensors = {k: v.detach().double().cpu().clone().contiguous() for k, v in tensors.items()}
    replace_atomically(path, lambda tmp: save_file(tensors, str(tmp), metadata=units))


def load_per_unit(path) -> dict[str, PerUnit]:
    """The per-unit values `save_per_unit` wrote; {} when the file is missing or unreadable (the intervals of
    that tap are then recorded as unavailable rather than the run failing)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            units, keys = f.metadata() or {}, set(f.keys())
            out: dict = {name: PerUnit(f.get_tensor(name), units.get(name, "units"))
                         for name in keys if "|" not in name}
            for name in {k.split("|")[0] for k in keys if k.endswith("|spread")}:
                out[name] = SpreadRatio(f.get_tensor(f"{name}|spread"), f.get_tensor(f"{name}|centroids"),
                                        units.get(name, "units"))
            for name in {k.split("|")[0] for k in keys if k.endswith("|linearised")}:
                out[name] = Linearised(f.get_tensor(f"{name}|linearised"), units.get(name, "units"))
            for name in {k.split("|")[0] for k in keys if "|r|" in k}:
                parts = {k.split("|r|", 1)[1]: f.get_tensor(k) for k in keys if k.startswith(f"{name}|r|")}
                out[name] = Recomputed(units[f"{name}|kind"], parts, units.get(name, "units"),
                                       units.get(f"{name}|how", "the statistic recomputed on each resample"),
                                       bool(units.get(f"{name}|reflect")))
            for name in {k.split("|")[0] for k in keys if k.endswith("|points")}:
                out[name] = Uniformity(f.get_tensor(f"{name}|points"), float(f.get_tensor(f"{name}|t")[0]),
                                       units.get(name, "units"))
            return out
    except (OSError, ValueError, RuntimeError):
        return {}


# Why a metric's interval is obtained the way it is, where that is not the obvious way (`probes.influence`).
INTERVAL_NOTES = {
    "rankme": "; not RankMe recomputed per resample: a resample drawn with replacement holds ~63% distinct rows, "
              "which narrows its spectrum and biases a recomputed RankMe low (by several of its standard deviations "
              "at 1,347 rows); the interval is for RankMe at this number of rows",
    "mi.gaussian": "; the PCA basis held fixed",
}
UNAVAILABLE = {
    "mi.infonce": "unavailable: the InfoNCE read-out keeps no per-batch values to resample "
                  "(probes.information.mutual_information); seeds give it an interval",
}


def tap_uncertainty(metrics: dict[str, float], per_unit: dict, resamples: dict[str, Resamples]) -> dict[str, dict]:
    """{metric: uncertainty record} for every metric of one tap: a bootstrap interval where the metric is a mean
    of per-unit values over units with shared resamples, else a record saying why there is none."""
    out: dict[str, dict] = {}
    for metric, value in metrics.items():
        p = per_unit.get(metric)
        if p is None or p.unit not in resamples:
            why = UNAVAILABLE.get(metric, "unavailable: not a mean over test images or views; seeds give it an "
                                          "interval")
            out[metric] = {"ci95": None, "method": why}
            continue
        mean = p.value()
        if not math.isclose(mean, value, rel_tol=1e-9, abs_tol=1e-12):
            out[metric] = {"ci95": None, "method": f"unavailable: per-unit values give {mean}, not {value}"}
            continue
        kind = "stratified by class, " if resamples[p.unit].stratified else ""
        how = ("the ratio recomputed on each resample" if isinstance(p, SpreadRatio) else
               "the statistic recomputed on each resample (pairs of two different images)"
               if isinstance(p, Uniformity) else
               "percentile interval of the linearised (delta-method) per-unit pseudo-values"
               if isinstance(p, Linearised) else getattr(p, "how", "percentile interval"))
        note = INTERVAL_NOTES.get(metric, "")
        out[metric] = interval(p, resamples[p.unit], f"paired bootstrap over {p.unit} ({kind}resamples shared "
                                                     f"by every tap), {how}{note}")
    return out
