"""The paired bootstrap intervals of `stats.bootstrap` against `scipy.stats.bootstrap` on the same per-image values.

The quickstart's shapes: 450 test images, 7 taps, 8 per-image metrics per tap, and for each of 3 heads the margin
head − backbone of every metric, paired on the same images, with 2,000 resamples and percentile intervals.
headprobe draws one set of resamples per run (`bootstrap_resamples`) and reads every metric's and every margin's
replicates off one weight-matrix product each (`Resamples.weights`); scipy draws its own resamples per call:
`bootstrap((v,), mean)` per tap and metric, `bootstrap((b, h), mean(h − b), paired=True)` per margin, both
vectorised. Unstratified resamples for both (scipy has no strata), so the intervals should agree to Monte Carlo
error: the check compares each endpoint's difference with the interval's width. headprobe's stratified resamples
(by class, as the run draws them) are timed too.

    python benchmarks/bench_bootstrap.py [--quick]
"""

from __future__ import annotations

import numpy as np
import torch
from _common import Report, interleaved, parse_args

from headprobe.stats.bootstrap import PerUnit, bootstrap_resamples, interval, percentile_interval

HEADS = 3
# Endpoints may differ by Monte Carlo error: with 2,000 resamples a 2.5% quantile moves by ~0.1 of the width.
AGREEMENT = 0.15


def per_image_values(n: int, taps: int, metrics: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(values (taps, metrics, n) float64, class labels (n,)): half the metrics 0/1 (accuracies), half continuous,
    each tap a noisy copy of the backbone's (tap 0), so margins are paired as real taps' are."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 10
    base = torch.randn(metrics, n, generator=g, dtype=torch.float64) + labels / 10
    taps_values = base + 0.5 * torch.randn(taps, metrics, n, generator=g, dtype=torch.float64)
    taps_values[:, : metrics // 2] = (taps_values[:, : metrics // 2] > 0.5).double()
    return taps_values, labels


def headprobe_intervals(values: torch.Tensor, labels: torch.Tensor | None, n_boot: int) -> list[list[float]]:
    """Every tap's and every head margin's 95% interval from one shared set of resamples."""
    taps, metrics, n = values.shape
    resamples = bootstrap_resamples(n, n_boot=n_boot, seed=0, strata=labels)
    stats = [[PerUnit(values[t, m], "test images") for m in range(metrics)] for t in range(taps)]
    out = [interval(stats[t][m], resamples, "percentile")["ci95"] for t in range(taps) for m in range(metrics)]
    for head in range(1, HEADS + 1):
        for m in range(metrics):
            margin = resamples.replicates_of(stats[head][m]) - resamples.replicates_of(stats[0][m])
            out.append(percentile_interval(margin))
    return out


def scipy_intervals(values: torch.Tensor, n_boot: int) -> list[list[float]]:
    """The same intervals with `scipy.stats.bootstrap`, one call per tap and metric and per margin."""
    from scipy.stats import bootstrap

    taps, metrics, _ = values.shape
    v = values.numpy()
    rng = np.random.default_rng(0)
    out = []
    for t in range(taps):
        for m in range(metrics):
            res = bootstrap((v[t, m],), np.mean, n_resamples=n_boot, method="percentile", vectorized=True,
                            random_state=rng)
            out.append([float(res.confidence_interval.low), float(res.confidence_interval.high)])
    for head in range(1, HEADS + 1):
        for m in range(metrics):
            res = bootstrap((v[0, m], v[head, m]), lambda b, h, axis: np.mean(h - b, axis=axis), paired=True,
                            n_resamples=n_boot, method="percentile", vectorized=True, random_state=rng)
            out.append([float(res.confidence_interval.low), float(res.confidence_interval.high)])
    return out


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], repeats=5, quick_repeats=3)
    n, taps, metrics, n_boot = (150, 4, 4, 500) if args.quick else (450, 7, 8, 2000)
    report = Report("bootstrap", args, {"test_images": n, "taps": taps, "metrics_per_tap": metrics, "heads": HEADS,
                                        "n_boot": n_boot, "intervals": taps * metrics + HEADS * metrics})
    values, labels = per_image_values(n, taps, metrics)
    times, results = interleaved({
        "headprobe, shared resamples": lambda: headprobe_intervals(values, None, n_boot),
        "headprobe, shared resamples stratified by class": lambda: headprobe_intervals(values, labels, n_boot),
        "scipy.stats.bootstrap per interval": lambda: scipy_intervals(values, n_boot)}, args.repeats)
    ours = report.timing("headprobe, shared resamples", times["headprobe, shared resamples"])
    report.timing("headprobe, stratified", times["headprobe, shared resamples stratified by class"])
    theirs = report.timing("scipy.stats.bootstrap per interval", times["scipy.stats.bootstrap per interval"])
    count = taps * metrics + HEADS * metrics
    report.check(f"{count} percentile intervals ({taps} taps x {metrics} metrics + {HEADS} heads' paired margins, "
                 f"{n} images, {n_boot} resamples)", "scipy.stats.bootstrap, one call each (vectorised)",
                 ">= 1x", f"{theirs / ours:.1f}x ({ours:.3f} s vs {theirs:.3f} s)", theirs >= ours, ratio=theirs / ours)
    gaps = [max(abs(a[0] - b[0]), abs(a[1] - b[1])) / max(a[1] - a[0], 1e-12)
            for a, b in zip(results["headprobe, shared resamples"], results["scipy.stats.bootstrap per interval"],
                            strict=True)]
    report.extra["endpoint_gap_over_width"] = {"max": max(gaps), "median": float(np.median(gaps))}
    report.check("the same intervals", "scipy's (other resamples)", f"endpoints within {AGREEMENT:g} of the width",
                 f"largest gap {max(gaps):.3f}, median {np.median(gaps):.3f} of the width", max(gaps) <= AGREEMENT)
    report.note("scipy cannot share one set of resamples between calls (so two taps' intervals are not paired on the "
                "same resamples unless passed together) and has no strata; headprobe's intervals are both.")
    report.finish()


if __name__ == "__main__":
    main()
