"""How the default probes' time and peak memory grow with N: k-NN, the linear probe and the spectrum on synthetic taps.

Synthetic features (only the probes are measured, no backbone): a seeded Gaussian mixture of 10 classes in D
dimensions (class means at distance ~3 against unit noise, so the probes have signal), N training rows and N / 10
test rows (the k-NN's queries grow with N, so its time is N × queries). Each (probe, N, D) runs in a fresh process
that builds the features, runs the probe once on 200 rows (imports and thread pools are not the probe's memory),
resets its peak RSS (/proc/self/clear_refs) and runs the probe's declared function with its default options
(`probes.declaration.declared_probe`), as a run calls it. Per probe and N: wall seconds, peak RSS of the process
and the peak above the features it was handed; per probe and D: the fitted growth exponents (least-squares slope
of log time and log peak against log N). The CPU's kind (AMX, AVX-512, AVX2 flags) and the load are recorded.

With `--head-width W` each probe reads a head's tap instead: the output of a seeded MLP head (Linear D -> W, BatchNorm,
ReLU, Linear W -> W; `--head-depth` layers) in eval mode over the synthetic backbone features, handed to the probe
by `pipeline.taps.tap_data` as a run hands it (on a code base where taps are computed whole, the (N, W) tap is
computed before the probe; read by rows, a block at a time as the probe reads it). The inputs are then the backbone
features, and the tap's cost is the probe's. Results go to results/scale_head_taps.json.

    python benchmarks/bench_scale.py [--quick] [--sizes 10000 100000 1000000] [--dims 384 768] [--threads 1]
    python benchmarks/bench_scale.py --sizes 100000 --dims 768 --head-width 2048 --probes knn spectrum
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch
from _common import Report, mib, parse_args, peak_rss_bytes, reset_peak_rss, rss_bytes, worker_code

PROBES = ("knn", "linear", "spectrum")
CLASSES = 10
CPU_FLAGS = ("amx_bf16", "amx_tile", "avx512f", "avx512_bf16", "avx2")


def cpu_kind() -> dict:
    """Which of CPU_FLAGS /proc/cpuinfo lists, and a one-word kind: amx, avx512, avx2 or other."""
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    present = {flag: flag in flags for flag in CPU_FLAGS}
    kind = ("amx" if present["amx_bf16"] else "avx512" if present["avx512f"] else "avx2" if present["avx2"]
            else "other")
    return {"kind": kind, "flags": present}


def mixture(n: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, d) float32 rows of a Gaussian mixture of CLASSES classes (the same class means for every seed: row i of
    class c is mean_c + unit Gaussian noise, the means ~3 apart), and their labels; built in blocks of rows."""
    means = torch.randn(CLASSES, d, generator=torch.Generator().manual_seed(12345)) * (2.2 / math.sqrt(d))
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    x = torch.empty(n, d)
    for start in range(0, n, 65_536):
        block = labels[start : start + 65_536]
        x[start : start + len(block)] = means[block] + torch.randn(len(block), d, generator=g)
    return x, labels


def tap(n: int, d: int, seed: int = 0):
    from headprobe.probes.tap_data import TapData

    x, y = mixture(n, d, seed)
    test_x, test_y = mixture(max(n // 10, CLASSES), d, seed + 1)
    return TapData("synthetic", x, y, test_x, test_y, CLASSES, seed=seed)


def head_tap_reader(data, head_width: int, head_depth: int):
    """(the backbone tap `data` -> the head's output tap as a run's probe gets it, the head): `tap_data` over the
    tap's features with the seeded head's last tap; where TapData has `whole` (taps read by rows), a probe that
    reads whole gets `data.whole(needs)`, as `pipeline.taps.run_probes` gives it."""
    from types import SimpleNamespace

    from headprobe.pipeline.taps import head_taps, tap_data
    from headprobe.train.heads import ProjectionHead

    torch.manual_seed(0)
    head = ProjectionHead(data.train_x.shape[1], depth=head_depth, width=head_width, act="relu", bn_hidden=True)
    recipe = SimpleNamespace(seed=data.seed, data=SimpleNamespace(val_fraction=data.val_fraction))
    out_tap = head_taps("head", head)[-1]

    def read(tap_data_of, declared):
        fs = SimpleNamespace(train=SimpleNamespace(features=tap_data_of.train_x, labels=tap_data_of.train_y),
                             test=SimpleNamespace(features=tap_data_of.test_x, labels=tap_data_of.test_y),
                             n_classes=tap_data_of.n_classes, probe_views=None, rotated=None, orbits=None,
                             inert_params=None)
        tapped = tap_data(fs, out_tap, recipe)
        return tapped if declared.reads == "chunks" or not hasattr(tapped, "whole") else tapped.whole(declared.needs)

    return read


def measure_worker(probe: str, n: int, d: int, head_width: int | None = None, head_depth: int = 2) -> None:
    """In this fresh process: one run of `probe` on an (n, d) tap (with `head_width`: on a head's output tap over
    it, computed as a run computes it, inside the timed and measured part); prints seconds, peaks and metrics as
    JSON."""
    import dataclasses

    from headprobe.probes.declaration import declared_probe

    function = declared_probe(probe)
    data = tap(n, d)
    read = head_tap_reader(data, head_width, head_depth) if head_width else (lambda tapped, _: tapped)
    small = dataclasses.replace(data, train_x=data.train_x[:200], train_y=data.train_y[:200],
                                test_x=data.test_x[:50], test_y=data.test_y[:50])
    function(read(small, function))  # imports, thread pools, kernels: not the probe's memory
    base = rss_bytes()
    counter = "VmHWM after /proc/self/clear_refs" if reset_peak_rss() else "ru_maxrss (not reset: includes start-up)"
    start = time.perf_counter()
    out = function(read(data, function))
    seconds = time.perf_counter() - start
    peak = peak_rss_bytes()
    metrics = {k: v for k, v in out.metrics.items() if k in ("knn.k20.acc", "linear.acc", "rankme", "alpha_req")}
    print(json.dumps({"seconds": seconds, "peak_rss_bytes": peak, "peak_above_inputs_bytes": peak - base,
                      "inputs_rss_bytes": base, "counter": counter, "metrics": metrics}))


def measure(probe: str, n: int, d: int, head_width: int | None = None, head_depth: int = 2) -> dict:
    code = worker_code("bench_scale", f"measure_worker({probe!r}, {n}, {d}, {head_width!r}, {head_depth})")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def growth_exponent(sizes: list[int], values: list[float]) -> float | None:
    """The least-squares slope of log(value) against log(size): value ∝ size^slope. None below 2 points."""
    if len(sizes) < 2:
        return None
    xs, ys = [math.log(s) for s in sizes], [math.log(max(v, 1e-12)) for v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def extra_options(parser) -> None:
    parser.add_argument("--sizes", type=int, nargs="+", default=None,
                        help="training rows N (default 10000 100000; 2000 8000 with --quick); add 1000000 for 1M")
    parser.add_argument("--dims", type=int, nargs="+", default=None, help="feature dims D (default 384 768; 64)")
    parser.add_argument("--probes", nargs="+", default=list(PROBES), choices=PROBES, help="probes to measure")
    parser.add_argument("--head-width", type=int, default=None,
                        help="probe a head's output tap of this width over the features (default: the features)")
    parser.add_argument("--head-depth", type=int, default=2, help="the head's linear layers (with --head-width)")


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], repeats=1, quick_repeats=1, extra=extra_options)
    sizes = sorted(args.sizes or ([2000, 8000] if args.quick else [10_000, 100_000]))
    dims = args.dims or ([64] if args.quick else [384, 768])
    if min(sizes) < 2 * CLASSES * 10:
        sys.exit(f"--sizes must be at least {2 * CLASSES * 10} rows (the linear probe's validation split needs "
                 f"every class), got {min(sizes)}.")
    head = {"head_width": args.head_width, "head_depth": args.head_depth} if args.head_width else {}
    report = Report("scale_head_taps" if head else "scale", args,
                    {"sizes": sizes, "dims": dims, "probes": args.probes, "classes": CLASSES, "test_rows": "N // 10",
                     "options": "each probe's declared defaults", **head})
    report.machine["cpu_kind"] = cpu_kind()
    rows, growth = [], {}
    for d in dims:
        for probe in args.probes:
            measured = []
            for n in sizes:
                result = measure(probe, n, d, args.head_width, args.head_depth)
                report.timing(f"{probe} N={n} D={d}", [result["seconds"]], peak_rss_mib=mib(result["peak_rss_bytes"]),
                              peak_above_inputs_mib=mib(result["peak_above_inputs_bytes"]))
                print(f"   {probe} N={n} D={d}: {result['seconds']:.2f} s, peak RSS {mib(result['peak_rss_bytes'])} "
                      f"MiB ({mib(result['peak_above_inputs_bytes'])} MiB above the features) {result['metrics']}",
                      flush=True)
                rows.append({"probe": probe, "n": n, "d": d, "test_rows": max(n // 10, CLASSES), **result})
                measured.append(result)
            growth[f"{probe} D={d}"] = {
                "time": growth_exponent(sizes, [r["seconds"] for r in measured]),
                "peak_rss": growth_exponent(sizes, [r["peak_rss_bytes"] for r in measured]),
                "peak_above_inputs": growth_exponent(sizes, [max(r["peak_above_inputs_bytes"], 1) for r in measured]),
            }
            print(f"   {probe} D={d} growth exponents in N: {growth[f'{probe} D={d}']}", flush=True)
    report.extra["measurements"] = rows
    report.extra["growth_exponents"] = growth
    report.note("Peak RSS is the whole process (Python, torch, the features it holds: N x D train and N/10 x D test "
                "float32); peak_above_inputs is what the probe adds. Exponents: slope of log value vs log N.")
    report.finish()


if __name__ == "__main__":
    main()
