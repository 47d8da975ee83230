"""Intervals for values that come in clusters: evaluation batches or constructed states within seeds.

States built from one seed share that seed's draws, so they are not independent draws of "what this kind of head
does"; three seeds are too few for a cluster bootstrap alone (it has 10 distinct draws and collapses to a point
when every seed agrees). So a proportion gets the envelope of two intervals:

- **Wilson at the effective size** n / deff, deff = 1 + (n̄ − 1)·ICC (Kish's design effect), the intra-seed
  correlation ICC by the one-way ANOVA estimator over seeds, clipped to [0, 1] (0 when every state of every seed
  agrees: there is no between-seed variation to inflate). Wilson keeps its coverage at 0/n and n/n, where a
  bootstrap gives [0, 0];
- **the two-stage cluster bootstrap**: seeds drawn with replacement, then the items of each drawn seed, 2,000
  replicates, percentile interval.

A difference of two proportions gets the envelope of Newcombe's hybrid score interval (from the two Wilson
intervals) and the paired cluster bootstrap (the same seeds drawn for both). A mean of continuous values (a share
per evaluation batch) gets the cluster bootstrap alone.

>>> wilson(0, 150)[1] < 0.025 and wilson(150, 150)[0] > 0.975
True
>>> round(design_effect([[1, 1, 0, 0], [1, 1, 0, 0]]), 3)
1.0
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

Z95 = 1.959963984540054
N_BOOT = 2000


def wilson(k: float, n: float, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval of the proportion k/n (n may be an effective size, k scaled with it)."""
    if not n > 0:
        raise ValueError(f"a proportion needs at least one item, got n = {n}.")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def icc(clusters: Sequence[Sequence[float]]) -> float:
    """The one-way ANOVA intra-cluster correlation of 0/1 values grouped by cluster, clipped to [0, 1]; 0 with one
    cluster or without any variation."""
    sizes = [len(c) for c in clusters]
    n, j = sum(sizes), len(clusters)
    if j < 2 or n <= j:
        return 0.0
    p = sum(sum(c) for c in clusters) / n
    means = [sum(c) / len(c) for c in clusters]
    msb = sum(m * (q - p) ** 2 for m, q in zip(sizes, means, strict=True)) / (j - 1)
    msw = sum(sum((x - q) ** 2 for x in c) for c, q in zip(clusters, means, strict=True)) / (n - j)
    n0 = (n - sum(m * m for m in sizes) / n) / (j - 1)
    denominator = msb + (n0 - 1) * msw
    return min(1.0, max(0.0, (msb - msw) / denominator)) if denominator > 0 else 0.0


def design_effect(clusters: Sequence[Sequence[float]]) -> float:
    """Kish's 1 + (n̄ − 1)·ICC of `clusters` (n̄ the mean cluster size)."""
    mean_size = sum(len(c) for c in clusters) / len(clusters)
    return 1 + (mean_size - 1) * icc(clusters)


def _percentiles(draws: torch.Tensor) -> tuple[float, float]:
    low, high = torch.quantile(draws, torch.tensor([0.025, 0.975], dtype=torch.float64))
    return float(low), float(high)


def cluster_bootstrap(clusters: Sequence[Sequence[float]], n_boot: int = N_BOOT, seed: int = 0) -> tuple[float, float]:
    """The 95% percentile interval of the pooled mean under the two-stage cluster bootstrap."""
    _check(clusters)
    gen = torch.Generator().manual_seed(seed)
    return _percentiles(_paired_draws(clusters, torch.randint(len(clusters), (n_boot, len(clusters)), generator=gen),
                                      gen))


def _check(clusters) -> None:
    if not clusters or any(len(c) == 0 for c in clusters):
        raise ValueError("every cluster (seed) needs at least one value; drop empty seeds before the interval.")


def proportion_interval(clusters: Sequence[Sequence[float]], n_boot: int = N_BOOT, seed: int = 0) -> dict:
    """{"value": the pooled proportion, "ci95": the envelope of Wilson at n/deff and the cluster bootstrap,
    "wilson", "bootstrap", "design_effect", "n": items, "n_clusters"} of 0/1 values grouped by seed."""
    _check(clusters)
    n = sum(len(c) for c in clusters)
    k = sum(sum(c) for c in clusters)
    deff = design_effect(clusters)
    w = wilson(k / deff, n / deff)
    b = cluster_bootstrap(clusters, n_boot, seed)
    return {"value": k / n, "ci95": [min(w[0], b[0]), max(w[1], b[1])], "wilson": list(w), "bootstrap": list(b),
            "design_effect": deff, "n": n, "n_clusters": len(clusters)}


def difference_interval(first: Sequence[Sequence[float]], second: Sequence[Sequence[float]], n_boot: int = N_BOOT,
                        seed: int = 0) -> dict:
    """The pooled proportion of `first` minus that of `second` (0/1 values grouped by the same seeds, in the same
    order): {"value", "ci95": the envelope of Newcombe's hybrid score interval (each Wilson at its n/deff) and the
    paired cluster bootstrap, "newcombe", "bootstrap"}."""
    if len(first) != len(second):
        raise ValueError(f"the difference pairs seeds: {len(first)} and {len(second)} seeds were given; pass both "
                         "sides grouped by the same seeds.")
    a, b = proportion_interval(first, n_boot, seed), proportion_interval(second, n_boot, seed)
    d = a["value"] - b["value"]
    (l1, u1), (l2, u2) = a["wilson"], b["wilson"]
    newcombe = [d - math.hypot(a["value"] - l1, u2 - b["value"]), d + math.hypot(u1 - a["value"], b["value"] - l2)]
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(first), (n_boot, len(first)), generator=gen)
    boot = _paired_draws(first, picks, gen) - _paired_draws(second, picks, gen)
    low, high = _percentiles(boot)
    ci95 = [max(-1.0, min(newcombe[0], low)), min(1.0, max(newcombe[1], high))]  # a difference of proportions
    return {"value": d, "ci95": ci95, "newcombe": newcombe, "bootstrap": [low, high]}


def _paired_draws(clusters, picks: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """(n_boot,) pooled means of two-stage resamples: the seeds `picks` (n_boot, J) chose, then each drawn seed's
    items with replacement."""
    values = [torch.as_tensor(list(c), dtype=torch.float64) for c in clusters]
    sums = torch.zeros(len(picks), dtype=torch.float64)
    counts = torch.zeros(len(picks), dtype=torch.float64)
    for c, v in enumerate(values):
        items = torch.randint(len(v), (len(picks), len(v)), generator=gen)
        chosen = (picks == c).sum(dim=1).to(torch.float64)  # how often each replicate drew seed c
        sums += chosen * v[items].sum(dim=1)
        counts += chosen * len(v)
    return sums / counts


def mean_interval(clusters: Sequence[Sequence[float]], seed: int = 0) -> tuple[list[float], str]:
    """(95% interval of the pooled mean, how it was made) of values grouped by seed (a list per seed, evaluation
    batches within it): the wider of the two-stage cluster bootstrap and the t interval over the per-seed means
    (Student, S − 1 degrees of freedom: three seeds are too few for the bootstrap alone); with one seed the
    bootstrap over its values, said to cover them only (Q-whiten's and Q-metric's rule)."""
    from headprobe.stats.retraining import t_intervals

    boot = list(cluster_bootstrap(clusters, seed=seed))
    if len(clusters) < 2:
        return boot, "evaluation batches only (one seed: it does not cover retraining)"
    means = torch.tensor([sum(c) / len(c) for c in clusters], dtype=torch.float64)
    t_ci, se = t_intervals(means)
    t_ci = t_ci.tolist()
    if float(se) > 0 and t_ci[1] - t_ci[0] > boot[1] - boot[0]:
        return t_ci, f"t interval over {len(clusters)} seeds' means (wider than the cluster bootstrap)"
    return boot, "cluster bootstrap over seeds and batches (wider than the t interval over seeds)"
