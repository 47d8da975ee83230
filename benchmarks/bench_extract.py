"""Feature extraction: headprobe `extract` against a bare `model(pixel_values)` loop, and its peak memory.

Throughput: the offline DINOv2 ViT-S/14 on the same Fashion-MNIST images, headprobe's pipeline (dataset ->
decode -> preprocess -> batch -> backbone -> pooled features, cache off) against the bare model over pixel tensors
made beforehand (untimed). The pipeline's overhead is what the first costs beyond the second.

Peak memory: `extract` of N_small and N_large images, each in a fresh process that first loads the model and the
data and runs a warm-up extraction of one batch, then resets the peak-RSS counter (VmHWM, through
/proc/self/clear_refs) and extracts the N images. Per N: the peak above the RSS just before extraction, and that
peak minus the returned features (N x 384 float32 = N x 1.5 KiB, which any extractor must hold): the streaming
overhead, which must not grow with N (the images are streamed, not held). The check compares the streaming
overheads of the two N. The process's whole peak RSS (ru_maxrss) is reported too, but model loading sets it, so
it says nothing about extraction. The workers run with glibc's mmap threshold fixed (`MALLOC_ENV`), so that memory
malloc keeps after a free does not count as held.

    python benchmarks/bench_extract.py [--quick]
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import torch
from _common import (
    Report,
    device,
    interleaved,
    median,
    mib,
    parse_args,
    peak_rss_bytes,
    reset_peak_rss,
    rss_bytes,
    timed,
    worker_code,
)

BATCH = 64
RESOLUTION = 112  # the CPU recipes' resolution; 224 is DINOv2's own
MEMORY_RESOLUTION = 28  # memory runs: the smallest input of 2 x 2 patches, so that 20k images fit the time budget
THROUGHPUT_TARGET, MEMORY_TARGET = 0.9, 1.2


def fashion_mnist(n: int):
    from headprobe.data import load_data
    from headprobe.recipe import DataSpec, LimitSpec

    return load_data(DataSpec(source="fashion-mnist", limit=LimitSpec(train=n, test=10)))


def headprobe_extract(backbone, data):
    from headprobe.features import extract

    return extract(backbone, data.train, data_info=data.info, split="train", batch_size=BATCH, cache=False)


def memory_worker(n: int) -> None:
    """Extract n images in this fresh process, after loading and a warm-up; print its peak memory as JSON.

    extraction_peak_bytes: the peak RSS during `extract` above the RSS just before it (None where the peak counter
    cannot be reset); streaming_overhead_bytes: that minus the bytes of the returned features."""
    from headprobe.backbones import load_backbone

    backbone = load_backbone("offline:dinov2-vits14", resolution=MEMORY_RESOLUTION)
    data = fashion_mnist(n)
    headprobe_extract(backbone, fashion_mnist(BATCH))  # warm-up: lazy imports, thread pools, allocator arenas
    before = rss_bytes()
    startup_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    reset = reset_peak_rss()
    seconds, out = timed(lambda: headprobe_extract(backbone, data))
    during = peak_rss_bytes() - before if reset else None
    maxrss = max(startup_peak, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    features = out.features.numel() * out.features.element_size()
    print(json.dumps({"n": n, "rss_before_bytes": before, "maxrss_bytes": maxrss, "startup_maxrss_bytes": startup_peak,
                      "extraction_peak_bytes": during, "features_bytes": features,
                      "streaming_overhead_bytes": None if during is None else during - features,
                      "seconds": seconds}))


# glibc raises its mmap threshold (up to 32 MiB) each time a large block is freed, after which freed temporaries
# stay in the heap and count in the RSS: over the first ~50 batches the RSS of a plain forward loop creeps up by
# ~3 MiB and then stays there, so a short extraction looked leaner than a long one. A fixed threshold turns that off
# in the measured processes: blocks of 128 KiB and more are mapped and unmapped, and the RSS follows live memory.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}


def measure_memory(n: int) -> dict:
    out = subprocess.run([sys.executable, "-c", worker_code("bench_extract", f"memory_worker({n})")],
                         check=True, capture_output=True, text=True, env={**os.environ, **MALLOC_ENV})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    n_throughput, n_small, n_large = (64, 200, 2_000) if args.quick else (256, 2_000, 20_000)
    report = Report("extract", args, {"backbone": "offline:dinov2-vits14", "data": "fashion-mnist",
                                      "throughput_images": n_throughput, "resolution": RESOLUTION,
                                      "batch_size": BATCH, "memory_images": [n_small, n_large],
                                      "memory_resolution": MEMORY_RESOLUTION})
    from headprobe.backbones import load_backbone

    backbone = load_backbone("offline:dinov2-vits14", resolution=RESOLUTION).to(device())
    data = fashion_mnist(n_throughput)
    pixels = torch.stack([backbone.preprocess(row["image"]) for row in data.train]).to(device())

    @torch.inference_mode()
    def bare_loop() -> torch.Tensor:
        return torch.cat([backbone.model(pixel_values=pixels[s : s + BATCH]).last_hidden_state[:, 0]
                          for s in range(0, len(pixels), BATCH)])

    headprobe_extract(backbone, fashion_mnist(BATCH))  # warm-up
    bare_loop()
    times, results = interleaved({"extract": lambda: headprobe_extract(backbone, data), "bare": bare_loop},
                                 args.repeats)
    t_extract = report.timing("headprobe extract (cache off)", times["extract"],
                              images_per_s=n_throughput / median(times["extract"]))
    t_bare = report.timing("bare model(pixel_values) over pre-made tensors", times["bare"],
                           images_per_s=n_throughput / median(times["bare"]))
    difference = float((results["extract"].features - results["bare"].cpu()).abs().max())
    ratio = t_bare / t_extract
    report.check(f"extraction throughput ({n_throughput} images, {RESOLUTION} px, {device().type})",
                 "bare model(pixel_values) loop", f">= {THROUGHPUT_TARGET:g}x (overhead <= 10%)",
                 f"{ratio:.2f}x ({n_throughput / t_extract:.1f} vs {n_throughput / t_bare:.1f} images/s)",
                 ratio >= THROUGHPUT_TARGET, ratio=ratio, max_abs_feature_difference=difference)

    fashion_mnist(10)  # converts the IDX files into the data cache once, outside the measured processes
    small, large = measure_memory(n_small), measure_memory(n_large)
    for m in (small, large):
        if m["extraction_peak_bytes"] is None:
            during = "n/a (the peak counter cannot be reset here)"
        else:
            during = (f"+{mib(m['extraction_peak_bytes'])} MiB above the post-load RSS "
                      f"{mib(m['rss_before_bytes'])} MiB = features {mib(m['features_bytes'])} MiB "
                      f"+ streaming overhead {mib(m['streaming_overhead_bytes'])} MiB")
        print(f"   N={m['n']:,}: peak during extraction {during}; whole-process maxrss {mib(m['maxrss_bytes'])} MiB "
              f"(after loading and warm-up {mib(m['startup_maxrss_bytes'])} MiB); {m['seconds']:.1f} s", flush=True)
    label = f"peak memory of extraction, N={n_small:,} vs N={n_large:,} ({MEMORY_RESOLUTION} px)"
    if small["extraction_peak_bytes"] is not None:
        # The honest quantity: what extraction holds beyond its output. The output itself grows with N (10x here).
        s_over, l_over = small["streaming_overhead_bytes"], large["streaming_overhead_bytes"]
        s_peak, l_peak = small["extraction_peak_bytes"], large["extraction_peak_bytes"]
        ratio = l_over / max(s_over, 1)
        report.check(label, f"the same at N={n_small:,}",
                     f"streaming overhead ratio <= {MEMORY_TARGET:g}",
                     f"{ratio:.2f} ({mib(s_over):.1f} vs {mib(l_over):.1f} MiB: peak RSS above the post-load RSS "
                     f"{mib(s_peak):.1f} vs {mib(l_peak):.1f} MiB, minus the features "
                     f"{mib(small['features_bytes']):.1f} vs {mib(large['features_bytes']):.1f} MiB)",
                     ratio <= MEMORY_TARGET, ratio=ratio, peak_above_ratio=l_peak / max(s_peak, 1))
    else:
        # No VmHWM reset (not Linux): only whole-process peaks, which model loading dominates -- not a pass.
        ratio = large["maxrss_bytes"] / small["maxrss_bytes"]
        report.check(label, f"the same at N={n_small:,}", f"streaming overhead ratio <= {MEMORY_TARGET:g}",
                     f"not measurable here (no peak-RSS reset); whole-process maxrss {ratio:.2f} "
                     f"({mib(small['maxrss_bytes']):.0f} vs {mib(large['maxrss_bytes']):.0f} MiB), set by model "
                     "loading", False, ratio=None)
    report.extra["memory"] = {
        "small": small, "large": large,
        "counter": "VmHWM reset after loading and a warm-up extraction, minus the RSS then; ru_maxrss per process",
        "environment": MALLOC_ENV,
        "streaming_overhead": "extraction_peak_bytes - features_bytes (the N x D float32 output must be held)"}
    report.extra["derived"] = {"extract_images_per_s": n_throughput / t_extract,
                               "bare_images_per_s": n_throughput / t_bare,
                               "max_abs_feature_difference": difference}
    report.note(f"headprobe's features equal the bare loop's class tokens to {difference:.1e} (max abs).")
    report.finish()


if __name__ == "__main__":
    main()
