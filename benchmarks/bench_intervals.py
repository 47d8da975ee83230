"""Intervals: what the bootstrap intervals and the paired verdict add to the probe stage.

The quickstart's shapes (1,347 training and 450 test images of 384-d features, 10 classes, 200 images with 2
views, 32 orbit images over the 10 steps of rotation45, 7 taps, 3 heads): the probes the quickstart runs that have
intervals (linear, k-NN, invariance, spectrum, view MI, orbits) on every tap, against `stats.tap_uncertainty` on
every tap and `buffer_verdict` with paired resamples for every head, plus what the probes compute only for
intervals (RankMe's and the Gaussian MI's per-unit values, the orbit measures per image and pair), which is taken
out of the probes' time. Target: intervals add at most 10% to the probe stage. The full mode also runs the real
quickstart (3 seeds) with every interval-only function timed where the run calls it (`quickstart_share`).

    python benchmarks/bench_intervals.py [--quick]
"""

from __future__ import annotations

from pathlib import Path

import torch
from _common import Report, interleaved, parse_args

from headprobe.probes.builtin.invariance import INVARIANCE as invariance
from headprobe.probes.builtin.knn import KNN as knn
from headprobe.probes.builtin.linear import LINEAR as linear
from headprobe.probes.builtin.orbits import ORBITS as orbits
from headprobe.probes.builtin.spectrum import SPECTRUM as spectrum
from headprobe.probes.builtin.view_mi import VIEW_MI as view_mi
from headprobe.probes.influence import gaussian_mi_per_pair, rankme_per_row
from headprobe.probes.orbit_intervals import orbit_statistics
from headprobe.probes.tap_data import TapData
from headprobe.stats.bootstrap import (
    ORBIT_IMAGES,
    TEST_IMAGES,
    TRAIN_IMAGES,
    VIEW_IMAGES,
    bootstrap_resamples,
    tap_uncertainty,
)
from headprobe.stats.measures import tap_measures
from headprobe.stats.verdict import buffer_verdict

TARGET = 0.10
HEADS = ("lin", "mlp_relu", "mlp_swish")


def make_taps(n: int, m: int, d: int, n_views: int, seed: int = 0) -> dict[str, TapData]:
    """Backbone features with 10 Gaussian classes, and each head tap a random map of them (two per MLP head)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(10, d, generator=g)
    y, yt = torch.arange(n) % 10, torch.arange(m) % 10
    x, xt = 0.3 * centres[y] + torch.randn(n, d, generator=g), 0.3 * centres[yt] + torch.randn(m, d, generator=g)
    views = x[:n_views, None] + 0.3 * torch.randn(n_views, 2, d, generator=g)
    orbit = xt[:32, None] + 0.2 * torch.randn(32, 10, d, generator=g).cumsum(dim=1)
    taps = {"backbone": TapData("backbone", x, y, xt, yt, 10, views=views, orbits={"rotation45": orbit},
                                orbit_labels=yt[:32])}
    names = ["lin@1", "lin", "mlp_relu@1", "mlp_relu", "mlp_swish@1", "mlp_swish"]
    for name in names:
        w = torch.randn(d, 256, generator=g) / d**0.5
        taps[name] = TapData(name, x @ w, y, xt @ w, yt, 10, views=views @ w,
                             orbits={"rotation45": orbit @ w}, orbit_labels=yt[:32])
    return taps


PROBES = ((linear, {"C_grid": (0.1, 1.0, 10.0)}), (knn, {"ks": [10, 20, 200]}), (invariance, {}), (spectrum, {}),
          (view_mi, {}), (orbits, {"sweeps": ["rotation45"], "n_images": 32}))


def principal_views(taps: dict[str, TapData]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each tap's two views on view_mi's PCA basis (the probe has them already; not timed)."""
    out = {}
    for name, tap in taps.items():
        z1, z2 = tap.views[:, 0].double(), tap.views[:, 1].double()
        both = torch.cat([z1, z2])
        mean = both.mean(0)
        basis = torch.linalg.svd(both - mean, full_matrices=False)[2][: min(32, len(z1) // 10)].T
        out[name] = ((z1 - mean) @ basis, (z2 - mean) @ basis)
    return out


def interval_inputs(taps: dict[str, TapData], principal: dict) -> None:
    """What the probes compute only for the intervals (the probes' time includes it; it is counted here)."""
    for name, tap in taps.items():
        rankme_per_row(tap.train_x, value=1.0)
        gaussian_mi_per_pair(*principal[name], 0.0)
        orbit_statistics(tap.orbits["rotation45"].double(), sweep="rotation45", labels=tap.orbit_labels)


def probe(taps: dict[str, TapData]) -> dict:
    out = {}
    for name, tap in taps.items():
        metrics, per_unit = {}, {}
        for fn, options in PROBES:
            result = fn(tap, **options)
            metrics |= result.metrics
            per_unit |= result.per_unit
        out[name] = (metrics, per_unit)
    return out


def intervals(taps: dict[str, TapData], probed: dict) -> None:
    test_labels = taps["backbone"].test_y
    train_labels = taps["backbone"].train_y
    resamples = {TEST_IMAGES: bootstrap_resamples(len(test_labels), strata=test_labels),
                 VIEW_IMAGES: bootstrap_resamples(len(taps["backbone"].views)),
                 TRAIN_IMAGES: bootstrap_resamples(len(train_labels), strata=train_labels),
                 ORBIT_IMAGES: bootstrap_resamples(32, strata=test_labels[:32])}
    records = {}
    for name, (metrics, per_unit) in probed.items():
        records[name] = {"metrics": metrics,
                         "uncertainty": tap_uncertainty(metrics, per_unit, resamples)}
    samples = {name: per_unit for name, (_, per_unit) in probed.items()}
    for head in HEADS:
        buffer_verdict(tap_measures(records, samples), head, resamples)


# What the intervals cost inside a real run: the functions that exist only for them, timed where the run calls them
# (the outermost call only). `pipeline.probing` calls both by their names in its own namespace, where they are timed.
INTERVAL_WORK = (("headprobe.pipeline.probing", "tap_intervals"), ("headprobe.pipeline.probing", "aggregate_seeds"),
                 ("headprobe.stats.verdict", "buffer_verdict"), ("headprobe.probes.influence", "rankme_per_row"),
                 ("headprobe.probes.influence", "gaussian_mi_per_pair"),
                 ("headprobe.probes.lidar_influence", "lidar_pseudo_values"),
                 ("headprobe.probes.orbit_intervals", "orbit_statistics"),
                 ("headprobe.probes.view_geometry", "sphere_points"))


def quickstart_share(out_dir) -> dict:
    """Run recipes/quickstart.yaml (3 seeds; the feature cache is used when warm) with the interval work timed:
    its seconds against the rest of the run's probe stage (`timing.probe_s`, which contains it). LiDAR's
    pseudo-values count less what `spectrum.lidar` costs on the same views (the metric is their mean)."""
    import importlib
    import time

    from headprobe import run
    from headprobe.probes.spectrum import lidar

    spent = {"s": 0.0, "depth": 0, "extra_s": 0.0}
    by_function: dict[str, float] = {}
    originals = []

    def timed(fn):
        def wrapper(*args, **kwargs):
            spent["depth"] += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent["depth"] -= 1
                if spent["depth"] == 0:
                    seconds = time.perf_counter() - t0
                    if fn.__name__ == "lidar_pseudo_values":
                        # The probe's LiDAR metric is the mean of these values: what the metric alone costs
                        # (`spectrum.lidar` on the same views, timed here and taken out of the run) is not interval
                        # work.
                        t1 = time.perf_counter()
                        lidar(*args, **kwargs)
                        own = time.perf_counter() - t1
                        seconds -= own
                        spent["extra_s"] += own
                    spent["s"] += seconds
                    by_function[fn.__name__] = by_function.get(fn.__name__, 0.0) + seconds
        return wrapper

    for module_name, name in INTERVAL_WORK:
        module = importlib.import_module(module_name)
        originals.append((module, name, getattr(module, name)))
        setattr(module, name, timed(getattr(module, name)))
    try:
        recipe = Path(__file__).resolve().parents[1] / "recipes" / "quickstart.yaml"
        results = run(recipe, out=out_dir, quiet=True, report=False)
    finally:
        for module, name, fn in originals:
            setattr(module, name, fn)
    probe_s = results["timing"]["probe_s"] - spent["extra_s"]  # without the benchmark's own LiDAR calls
    return {"probe_s": probe_s, "intervals_s": spent["s"], "share": spent["s"] / (probe_s - spent["s"]),
            "by_function_s": {k: round(v, 3) for k, v in sorted(by_function.items(), key=lambda kv: -kv[1])}}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    n, m, d, n_views = (400, 150, 64, 100) if args.quick else (1347, 450, 384, 200)
    report = Report("intervals", args, {"n_train": n, "n_test": m, "dim": d, "images_with_views": n_views,
                                        "taps": 7, "heads": len(HEADS), "n_boot": 2000})
    taps = make_taps(n, m, d, n_views)
    probed = probe(taps)
    principal = principal_views(taps)
    times, _ = interleaved({"probes": lambda: probe(taps), "intervals": lambda: intervals(taps, probed),
                            "inputs": lambda: interval_inputs(taps, principal)}, args.repeats)
    t_all = report.timing("linear + k-NN + invariance + spectrum + view MI + orbit probes on 7 taps",
                          times["probes"])
    t_inputs = report.timing("per-unit values computed only for intervals (RankMe, Gaussian MI, orbits)",
                             times["inputs"])
    t_int = report.timing("tap_uncertainty on 7 taps + buffer_verdict for 3 heads", times["intervals"])
    t_probe, t_int = t_all - t_inputs, t_int + t_inputs
    ratio = t_int / t_probe
    report.check(f"intervals' share of the probe stage (quickstart sizes, {m} test images, 2,000 resamples)",
                 "the probes alone", f"≤ {TARGET:.0%}", f"{ratio:.1%}", ratio <= TARGET,
                 ratio=ratio, probe_s=t_probe, intervals_s=t_int)
    report.note("the probe stage of a real quickstart run also has augment R² and rotation probes, which add no "
                "intervals, and its head taps are probed once per seed: the share there is smaller than here.")
    if not args.quick:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            real = quickstart_share(Path(folder) / "quickstart")
        report.check("intervals' share of the probe stage of `headprobe run recipes/quickstart.yaml` (3 seeds, "
                     "450 test images, 2,000 resamples)", "the rest of that probe stage", f"≤ {TARGET:.0%}",
                     f"{real['share']:.1%} ({real['intervals_s']:.1f} s of {real['probe_s']:.1f} s)",
                     real["share"] <= TARGET, **real)
    report.finish()


if __name__ == "__main__":
    main()
