"""Feature extraction: headprobe `extract` against a bare `model(pixel_values)` loop, and its peak memory.

Throughput: the offline DINOv2 ViT-S/14 on the same Fashion-MNIST images, headprobe's pipeline (dataset ->
decode -> preprocess -> batch -> backbone -> pooled features, cache off) against the bare model over pixel tensors
made beforehand (untimed). The pipeline's overhead is what the first costs beyond the second.

Peak memory: `extract` of N_small and N_large images, each in a fresh process. Two numbers per N: the process's
peak RSS (`resource.getrusage(...).ru_maxrss`, start-up and model loading included) and the peak above the RSS
just before extraction (VmHWM reset through /proc/self/clear_refs). The returned features are N x 384 float32,
which any extractor must hold; the images are not held.

    python benchmarks/bench_extract.py [--quick]
"""

from __future__ import annotations

import json
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
    """Extract n images in this fresh process; print its peak memory as JSON."""
    from headprobe.backbones import load_backbone

    backbone = load_backbone("offline:dinov2-vits14", resolution=MEMORY_RESOLUTION)
    data = fashion_mnist(n)
    small = fashion_mnist(BATCH)
    headprobe_extract(backbone, small)  # warm-up: lazy imports, thread pools
    before = rss_bytes()
    startup_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    reset = reset_peak_rss()
    seconds, out = timed(lambda: headprobe_extract(backbone, data))
    during = peak_rss_bytes() - before if reset else None
    maxrss = max(startup_peak, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    print(json.dumps({"n": n, "maxrss_bytes": maxrss, "extraction_peak_bytes": during, "seconds": seconds,
                      "features_bytes": out.features.numel() * out.features.element_size()}))


def measure_memory(n: int) -> dict:
    out = subprocess.run([sys.executable, "-c", worker_code("bench_extract", f"memory_worker({n})")],
                         check=True, capture_output=True, text=True)
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
        during = "n/a" if m["extraction_peak_bytes"] is None else f"{mib(m['extraction_peak_bytes'])} MiB"
        print(f"   N={m['n']}: maxrss {mib(m['maxrss_bytes'])} MiB, during extraction +{during}, "
              f"{m['seconds']:.1f} s", flush=True)
    ratio_rss = large["maxrss_bytes"] / small["maxrss_bytes"]
    during = ""
    if small["extraction_peak_bytes"] is not None:
        during = (f"; above the pre-extraction RSS {mib(small['extraction_peak_bytes']):.0f} vs "
                  f"{mib(large['extraction_peak_bytes']):.0f} MiB (features {mib(large['features_bytes']):.0f} MiB)")
    report.check(f"peak memory of extraction, N={n_small:,} vs N={n_large:,} ({MEMORY_RESOLUTION} px)",
                 f"the same at N={n_small:,}", f"ratio <= {MEMORY_TARGET:g}",
                 f"{ratio_rss:.2f} ({mib(small['maxrss_bytes']):.0f} vs {mib(large['maxrss_bytes']):.0f} MiB "
                 f"maxrss){during}", ratio_rss <= MEMORY_TARGET, ratio=ratio_rss)
    report.extra["memory"] = {"small": small, "large": large, "counter": "ru_maxrss per process; VmHWM after reset"}
    report.extra["derived"] = {"extract_images_per_s": n_throughput / t_extract,
                               "bare_images_per_s": n_throughput / t_bare,
                               "max_abs_feature_difference": difference}
    report.note(f"headprobe's features equal the bare loop's class tokens to {difference:.1e} (max abs).")
    report.finish()


if __name__ == "__main__":
    main()
