"""The 95% interval of a head's change (head − backbone) that includes retraining the head.

A head is a trained object: "what this kind of head does" varies with the training run as well as with the test
images it is scored on. With S ≥ 2 seeds (heads retrained on the same backbone features) `change_interval` takes
the wider of two intervals and names it:

- the hierarchical bootstrap: each replicate draws S seeds with replacement and one resample of the test images
  (the resamples `stats.bootstrap_resamples` shares with every tap), and its change is the mean over the drawn
  seeds of the head's statistic on those images minus the backbone's statistic on the *same* images (paired);
  it covers image-to-image variation, including effects that differ between images but repeat in every seed;
- the t interval over the S per-seed changes (Student, S − 1 degrees of freedom): resampling 3 seeds with
  replacement shrinks their spread by (S − 1)/S and a percentile interval over so few draws is too short, so
  where retraining dominates the t interval is the wider and the right one.

In the paper's regime the backbone is tuned with the head, once per seed, so each seed has its own backbone:
`backbone_value` is then a list (one value per seed, as `head_values`) and each seed's change is its head minus
its own backbone; the hierarchical bootstrap draws (backbone, head) pairs of one seed together. Runs paired by seed
(`stats.cross_run`: a backbone trained with a head against the no-head backbone of the same seed) are the same
case. Every seed of a replicate reads the one image resample (a crossed seeds × images bootstrap;
tests/test_cross_run_coverage.py checks its coverage where an image's effect repeats in every seed).

With one seed the interval is the paired bootstrap over test images alone, and its record says plainly that it
does not cover retraining. A statistic without per-unit values (`aug_r2.mean`) gets the t interval over seeds,
or none. tests/test_stats_retraining.py checks the coverage by simulation: ~95% for the wider interval with a
known effect, seed variance and image noise, and under-coverage of the image-only one when seeds vary.

>>> from headprobe.stats.bootstrap import PerUnit, bootstrap_resamples
>>> import torch
>>> b = PerUnit(torch.tensor([1.0, 0.0, 1.0, 1.0]), "test images")
>>> h = [PerUnit(torch.tensor([1.0, 0.0, 0.0, 1.0]), "test images")]
>>> change_interval(0.75, [0.5], b, h, {"test images": bootstrap_resamples(4, n_boot=200)}).kind
'test images only'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from headprobe.stats.bootstrap import ALPHA, Resamples, n_units, percentile_interval

HIERARCHICAL, T_SEEDS, IMAGES_ONLY, NONE = "hierarchical bootstrap", "t over seeds", "test images only", "none"


@dataclass
class Change:
    """backbone, head (the seed means) and change = head − backbone; ci95 the 95% interval of the change (None when
    there is none, `how` says why); kind one of HIERARCHICAL, T_SEEDS, IMAGES_ONLY, NONE; per_seed the per-seed
    changes; backbone_per_seed each seed's own backbone (a backbone tuned per seed), else None; boot the bootstrap
    replicates of the change (kinds HIERARCHICAL and IMAGES_ONLY), t = (se, df)."""

    backbone: float
    head: float
    change: float
    ci95: list[float] | None
    kind: str
    how: str
    n_seeds: int
    n_units: int | None = None
    unit: str | None = None
    per_seed: list[float] = field(default_factory=list)
    backbone_per_seed: list[float] | None = None
    boot: torch.Tensor | None = None
    t: tuple[float, int] | None = None

    def p_value(self, at: float = 0.0) -> float | None:
        """Two-sided p-value of "the change is `at`", by the interval's own rule (None without an interval): the
        bootstrap's tail mass on either side of `at` (+1 corrected), or Student's t over seeds."""
        if self.kind == T_SEEDS and self.t is not None:
            from scipy.stats import t as student

            se, df = self.t
            return float(min(1.0, 2 * student.sf(abs(self.change - at) / se, df)))
        if self.boot is not None:
            n = self.boot.numel()
            below, above = int((self.boot <= at).sum()), int((self.boot >= at).sum())
            return min(1.0, 2 * (min(below, above) + 1) / (n + 1))
        return None

    def record(self) -> dict:
        """The JSON record: backbone, head, change, ci95, interval (kind), how, n_seeds, n_units, unit, and with
        several seeds per_seed_change (and per_seed_backbone where each seed has its own backbone)."""
        out = {"backbone": self.backbone, "head": self.head, "change": self.change, "ci95": self.ci95,
               "interval": self.kind, "how": self.how, "n_seeds": self.n_seeds, "n_units": self.n_units,
               "unit": self.unit}
        out |= {"per_seed_change": self.per_seed} if self.n_seeds > 1 else {}
        return out | ({"per_seed_backbone": self.backbone_per_seed} if self.backbone_per_seed is not None else {})


def t_intervals(per_seed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """per_seed: (..., S) per-seed changes, S ≥ 2 -> (ci95 (..., 2), se (...)): the 95% t interval of their mean
    (Student, S − 1 degrees of freedom), for any number of leading dimensions at once."""
    from scipy.stats import t as student

    s = per_seed.shape[-1]
    se = per_seed.double().std(-1) / math.sqrt(s)
    half = float(student.ppf(1 - ALPHA / 2, s - 1)) * se
    mean = per_seed.double().mean(-1)
    return torch.stack([mean - half, mean + half], -1), se


def _t_interval(changes: list[float]) -> tuple[list[float], float, int] | None:
    """(ci95, se, df) of the mean of per-seed changes by Student's t; None with fewer than 2 seeds or no spread."""
    s = len(changes)
    if s < 2:
        return None
    ci, se = t_intervals(torch.tensor(changes, dtype=torch.float64))
    if float(se) == 0.0:
        return None
    return ci.tolist(), float(se), s - 1


def wider_interval(per_seed: torch.Tensor, boot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """per_seed: (..., S) per-seed changes (S ≥ 2), boot: (..., n_boot) their crossed bootstrap replicates
    (`hierarchical_replicates`) -> (ci95 (..., 2), by_t (...)): the wider of the bootstrap's percentile interval and
    the t interval over the seeds, and where the t interval is the wider (module docstring); for any number of
    leading dimensions at once (a coverage simulation takes every replication in one call)."""
    t_ci, _ = t_intervals(per_seed)
    boot_ci = torch.tensor(percentile_interval(boot), dtype=torch.float64)
    by_t = t_ci[..., 1] - t_ci[..., 0] > boot_ci[..., 1] - boot_ci[..., 0]
    return torch.where(by_t[..., None], t_ci, boot_ci), by_t


def hierarchical_replicates(backbone: torch.Tensor, heads: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """The crossed (seeds × images) bootstrap. heads: (..., S, n_boot) each seed's statistic on the shared image
    resamples; backbone: (..., n_boot) the backbone's on the same resamples, or (..., S, n_boot) where each seed has
    its own backbone (or reference) -> (..., n_boot) replicates of the change: per resample, the mean over S seeds
    drawn with replacement of head − backbone on those images (a seed's head with its own backbone). Every seed of
    a replicate reads the same image resample, so an image's effect that repeats in every seed counts once per
    replicate, not averaged away over independent draws. Leading dimensions (a coverage simulation's replications)
    share the seed draws. With S = 1 the paired image bootstrap."""
    s, n_boot = heads.shape[-2:]
    per_seed = backbone.dim() == heads.dim()
    if s == 1:
        return heads[..., 0, :] - (backbone[..., 0, :] if per_seed else backbone)
    gen = torch.Generator().manual_seed(seed)
    drawn = torch.randint(s, (n_boot, s), generator=gen)

    def drawn_mean(x: torch.Tensor) -> torch.Tensor:  # (..., S, n_boot) -> (..., n_boot)
        return x.transpose(-1, -2).gather(-1, drawn.expand(*x.shape[:-2], n_boot, s)).mean(-1)

    return drawn_mean(heads - backbone) if per_seed else drawn_mean(heads) - backbone


def change_interval(backbone_value: float | list[float], head_values: list[float], backbone_stat=None,
                    head_stats: list | None = None, resamples: dict[str, Resamples] | None = None,
                    seed: int = 0, reference: str | None = None, more_seeds: str = "add seeds: [0, 1, 2]") -> Change:
    """The change head − backbone of one metric and its 95% interval including retraining (module docstring).

    head_values: the metric at each seed's head (one value for one seed); backbone_value: the backbone's, or a
    list with each seed's own backbone's (a backbone tuned per seed, or the reference run of that seed);
    backbone_stat, head_stats: the per-unit statistics (`PerUnit`, `SpreadRatio`, `Recomputed`, ...) of the
    backbone (a list of each seed's, with a list of backbone values) and of each seed's head, or None; resamples:
    {unit: Resamples} shared by every tap (and seed); seed: the seeds' draws; reference, more_seeds: the words in
    `how` for what each seed is compared with and for how to get an interval over retraining."""
    s = len(head_values)
    if s < 1:
        raise ValueError("change_interval needs the head's value at one seed at least.")
    own = isinstance(backbone_value, (list, tuple))  # each seed its own backbone
    backbones = list(backbone_value) if own else [backbone_value] * s
    if len(backbones) != s:
        raise ValueError(f"change_interval got {len(backbones)} backbone values for {s} seeds; give one per seed.")
    head, backbone = sum(head_values) / s, sum(backbones) / s if own else backbone_value
    change = head - backbone
    per_seed = [v - b for v, b in zip(head_values, backbones, strict=True)]
    base = {"backbone": backbone, "head": head, "change": change, "n_seeds": s, "per_seed": per_seed,
            "backbone_per_seed": backbones if own else None}
    t = _t_interval(per_seed)
    resamples = resamples or {}
    backbone_stats = (list(backbone_stat) if backbone_stat is not None else [None] * s) if own else [backbone_stat]
    stats = [*backbone_stats, *(head_stats or [])]
    paired = (len(stats) == len(backbone_stats) + s and all(x is not None for x in stats)
              and len({x.unit for x in stats}) == 1 and stats[0].unit in resamples)
    if paired:
        shared = resamples[stats[0].unit]
        backbone_boot = torch.stack([shared.replicates_of(x) for x in backbone_stats])
        boot = hierarchical_replicates(backbone_boot if own else backbone_boot[0],
                                       torch.stack([shared.replicates_of(x) for x in head_stats]), seed)
        ci = percentile_interval(boot)
        if any(getattr(x, "reflect", False) for x in stats):  # the basic interval, as `stats.interval` gives them
            boot = 2 * change - boot
            ci = percentile_interval(boot)
        n, unit = n_units(stats[0]), stats[0].unit
        units = {"n_units": n, "unit": unit}
        if s == 1:
            return Change(**base, ci95=ci, kind=IMAGES_ONLY, boot=boot, **units,
                          how=f"paired bootstrap over {n} {unit} of one training run: covers the {unit}, not "
                              f"retraining ({more_seeds} for that)")
        if bool(wider_interval(torch.tensor(per_seed, dtype=torch.float64), boot)[1]):
            return Change(**base, ci95=t[0], kind=T_SEEDS, t=t[1:], **units,
                          how=f"t interval over {s} seeds (wider than the hierarchical bootstrap over seeds and "
                              f"{unit}, {ci[0]:.4g} to {ci[1]:.4g})")
        against = reference or ("each seed's head against the backbone tuned with it" if own else "the backbone")
        return Change(**base, ci95=ci, kind=HIERARCHICAL, boot=boot, **units,
                      how=f"hierarchical bootstrap: {s} seeds drawn with replacement and {n} {unit} resampled "
                          f"together, {against} on the same images (wider than the t interval over seeds)")
    if t is not None:
        return Change(**base, ci95=t[0], kind=T_SEEDS, t=t[1:],
                      how=f"t interval over {s} seeds (no per-image values: covers retraining, not the test images "
                          "alone)")
    why = ("no per-image values and one seed" if s == 1 else
           f"no per-image values and the {s} seeds agree exactly (no spread to estimate from)")
    return Change(**base, ci95=None, kind=NONE, how=f"no interval: {why}; {more_seeds} for one over retraining")
