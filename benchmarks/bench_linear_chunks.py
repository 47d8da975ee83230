"""The linear probe read whole against read in row blocks (#38): time, peak memory and its answers at users' sizes.

The declared linear probe (whitened primary, the label-MI bound, the standardised description; default options) on
bench_scale's synthetic 10-class Gaussian mixture, N training rows and N / 10 test rows, D dimensions, once with
`probes.row_blocks.BLOCK_ROWS` above N (every split one block: the whole-matrix path, as before) and once at a block
of `--block` rows. Each run in a fresh process, with its peak RSS reset after a warm-up on 200 rows (as bench_scale);
peak_above_inputs is what the probe adds to the features it was handed. The check: the same C and metrics.

    python benchmarks/bench_linear_chunks.py [--quick] [--sizes 100000] [--dim 768] [--block 16384] [--threads 1]
        [--concurrent]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from _common import Report, mib, parse_args, peak_rss_bytes, reset_peak_rss, rss_bytes, worker_code

METRICS = ("linear.acc", "linear.C", "linear.val_acc", "mi.label", "linear.standardized.acc", "linear.standardized.C")


def measure_worker(n: int, d: int, block: int) -> None:
    """In this fresh process: the declared linear probe on an (n, d) tap read in blocks of `block` rows."""
    import dataclasses

    from bench_scale import tap

    from headprobe.probes import row_blocks
    from headprobe.probes.declaration import declared_probe

    function = declared_probe("linear")
    data = tap(n, d)
    small = dataclasses.replace(data, train_x=data.train_x[:200], train_y=data.train_y[:200],
                                test_x=data.test_x[:50], test_y=data.test_y[:50])
    row_blocks.WHOLE_ROWS = 0  # the block size alone decides between the two paths here
    row_blocks.BLOCK_ROWS = 100
    function(small)  # imports, thread pools, kernels, both paths: not the probe's memory
    row_blocks.BLOCK_ROWS = block
    base = rss_bytes()
    counter = "VmHWM after /proc/self/clear_refs" if reset_peak_rss() else "ru_maxrss (not reset: includes start-up)"
    start, cpu = time.perf_counter(), time.process_time()
    out = function(data)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    peak = peak_rss_bytes()
    evaluations = sum(fit["evaluations"] for fit in out.protocol["fits"])
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds, "peak_rss_bytes": peak,
                      "peak_above_inputs_bytes": peak - base,
                      "inputs_rss_bytes": base, "counter": counter, "evaluations_whitened": evaluations,
                      "metrics": {k: v for k, v in out.metrics.items() if k in METRICS}}))


def measure(n: int, d: int, blocks: list[int], concurrent: bool) -> list[dict]:
    """One fresh process per block size, one after the other or (`concurrent`) side by side."""
    def start(block: int) -> subprocess.Popen:
        code = worker_code("bench_linear_chunks", f"measure_worker({n}, {d}, {block})")
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)

    def result(process: subprocess.Popen) -> dict:
        out, _ = process.communicate()
        if process.returncode:
            raise RuntimeError(f"a worker failed with exit code {process.returncode}")
        return json.loads(out.strip().splitlines()[-1])

    if concurrent:
        return [result(p) for p in [start(block) for block in blocks]]
    return [result(start(block)) for block in blocks]


def extra_options(parser) -> None:
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="training rows N (default 100000)")
    parser.add_argument("--dim", type=int, default=None, help="feature dimension D (default 768; 64 with --quick)")
    parser.add_argument("--block", type=int, default=None, help="rows per block (default 16384; 512 with --quick)")
    parser.add_argument("--concurrent", action="store_true",
                        help="run the whole and the chunked probe side by side (on a loaded machine: the wall times "
                             "then mean little, CPU seconds and peaks still do)")


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], repeats=1, quick_repeats=1, extra=extra_options)
    sizes = args.sizes or ([4000] if args.quick else [100_000])
    d = args.dim or (64 if args.quick else 768)
    block = args.block or (512 if args.quick else 16_384)
    report = Report("linear_chunks", args, {"sizes": sizes, "dim": d, "block_rows": block, "classes": 10,
                                            "test_rows": "N // 10", "probe": "declared linear probe, defaults"})
    rows = []
    for n in sizes:
        whole, chunked = measure(n, d, [10 * n, block], args.concurrent)
        for label, result in (("whole", whole), (f"blocks of {block}", chunked)):
            report.timing(f"linear N={n} D={d} {label}", [result["seconds"]], cpu_s=round(result["cpu_seconds"], 1),
                          peak_rss_mib=mib(result["peak_rss_bytes"]),
                          peak_above_inputs_mib=mib(result["peak_above_inputs_bytes"]))
            print(f"   N={n} D={d} {label}: {result['seconds']:.1f} s ({result['cpu_seconds']:.1f} s CPU), "
                  f"peak {mib(result['peak_rss_bytes'])} MiB "
                  f"({mib(result['peak_above_inputs_bytes'])} MiB above the features), {result['metrics']}",
                  flush=True)
        same = whole["metrics"]["linear.C"] == chunked["metrics"]["linear.C"] and \
            whole["metrics"]["linear.acc"] == chunked["metrics"]["linear.acc"]
        report.check(f"linear probe N={n} D={d}, blocks of {block}", "the same probe read whole",
                     "same C and linear.acc; less memory above the features",
                     f"C {chunked['metrics']['linear.C']} vs {whole['metrics']['linear.C']}, acc "
                     f"{chunked['metrics']['linear.acc']} vs {whole['metrics']['linear.acc']}; "
                     f"{mib(chunked['peak_above_inputs_bytes'])} vs {mib(whole['peak_above_inputs_bytes'])} MiB "
                     f"above the features; {chunked['cpu_seconds']:.1f} vs {whole['cpu_seconds']:.1f} CPU s",
                     same and chunked["peak_above_inputs_bytes"] < whole["peak_above_inputs_bytes"])
        rows.append({"n": n, "d": d, "block_rows": block, "whole": whole, "chunked": chunked})
    report.extra["measurements"] = rows
    report.note("Peak RSS is the whole process; peak_above_inputs is what the probe adds to the N x D train and "
                "N/10 x D test float32 features it was handed.")
    report.finish()


if __name__ == "__main__":
    main()
