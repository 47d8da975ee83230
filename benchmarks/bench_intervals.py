"""Intervals: what the bootstrap intervals and the paired verdict add to the probe stage.

The quickstart's shapes (1,347 training and 450 test images of 384-d features, 10 classes, 200 images with 2
views, 7 taps, 3 heads): the probes the quickstart runs that have per-image values (linear, k-NN, invariance) on
every tap, against the same plus `stats.tap_uncertainty` on every tap and `buffer_verdict` with paired resamples
for every head. Target: intervals add at most 10% to the probe stage.

    python benchmarks/bench_intervals.py [--quick]
"""

from __future__ import annotations

import torch
from _common import Report, interleaved, parse_args

from headprobe.buffer import buffer_verdict
from headprobe.probes.suite import TapData, invariance, knn, linear
from headprobe.stats import TEST_IMAGES, VIEW_IMAGES, bootstrap_resamples, tap_uncertainty

TARGET = 0.10
HEADS = ("lin", "mlp_relu", "mlp_swish")


def make_taps(n: int, m: int, d: int, n_views: int, seed: int = 0) -> dict[str, TapData]:
    """Backbone features with 10 Gaussian classes, and each head tap a random map of them (two per MLP head)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(10, d, generator=g)
    y, yt = torch.arange(n) % 10, torch.arange(m) % 10
    x, xt = 0.3 * centres[y] + torch.randn(n, d, generator=g), 0.3 * centres[yt] + torch.randn(m, d, generator=g)
    views = x[:n_views, None] + 0.3 * torch.randn(n_views, 2, d, generator=g)
    taps = {"backbone": TapData("backbone", x, y, xt, yt, 10, views=views)}
    names = ["lin@1", "lin", "mlp_relu@1", "mlp_relu", "mlp_swish@1", "mlp_swish"]
    for name in names:
        w = torch.randn(d, 256, generator=g) / d**0.5
        taps[name] = TapData(name, x @ w, y, xt @ w, yt, 10, views=views @ w)
    return taps


def probe(taps: dict[str, TapData]) -> dict:
    out = {}
    for name, tap in taps.items():
        metrics, per_unit = {}, {}
        for fn, options in ((linear, {"C_grid": (0.1, 1.0, 10.0)}), (knn, {"ks": [10, 20, 200]}), (invariance, {})):
            result = fn(tap, **options)
            metrics |= result.metrics
            per_unit |= result.per_unit
        out[name] = (metrics, per_unit)
    return out


def intervals(taps: dict[str, TapData], probed: dict) -> None:
    test_labels = taps["backbone"].test_y
    resamples = {TEST_IMAGES: bootstrap_resamples(len(test_labels), strata=test_labels),
                 VIEW_IMAGES: bootstrap_resamples(len(taps["backbone"].views))}
    records = {}
    for name, (metrics, per_unit) in probed.items():
        records[name] = {"metrics": metrics,
                         "uncertainty": tap_uncertainty(metrics, per_unit, resamples)}
    samples = {name: per_unit for name, (_, per_unit) in probed.items()}
    for head in HEADS:
        buffer_verdict(records, head, samples, resamples)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    n, m, d, n_views = (400, 150, 64, 100) if args.quick else (1347, 450, 384, 200)
    report = Report("intervals", args, {"n_train": n, "n_test": m, "dim": d, "images_with_views": n_views,
                                        "taps": 7, "heads": len(HEADS), "n_boot": 2000})
    taps = make_taps(n, m, d, n_views)
    probed = probe(taps)
    times, _ = interleaved({"probes": lambda: probe(taps), "intervals": lambda: intervals(taps, probed)},
                           args.repeats)
    t_probe = report.timing("linear + k-NN + invariance probes on 7 taps", times["probes"])
    t_int = report.timing("tap_uncertainty on 7 taps + buffer_verdict for 3 heads", times["intervals"])
    ratio = t_int / t_probe
    report.check(f"intervals' share of the probe stage (quickstart sizes, {m} test images, 2,000 resamples)",
                 "the probes alone", f"≤ {TARGET:.0%}", f"{ratio:.1%}", ratio <= TARGET,
                 ratio=ratio, probe_s=t_probe, intervals_s=t_int)
    report.note("the probe stage of a real quickstart run also has spectrum, view MI, augment R², rotation and "
                "orbit probes, which add no intervals: the share there is smaller than measured here.")
    report.finish()


if __name__ == "__main__":
    main()
