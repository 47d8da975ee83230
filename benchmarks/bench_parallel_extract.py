"""Peak memory per process of a 2-process extraction (torchrun, gloo on CPU) into the feature cache: each process
writing its rows into the one cache file (`features.parallel_file`) against the shards gathered onto every process
(the code of git revision `--before REF`, `git archive`d into a temporary folder).

A synthetic data source (N tiny images made on the fly) and a trivial backbone (a linear map of the pixel means to D
features), so the benchmark measures headprobe's handling of the (N, D) features, not a ViT. Each process builds
its data and backbone, runs one small uncached extraction (imports, thread pools), resets its peak RSS
(/proc/self/clear_refs) and extracts N images with the cache on and memory-mapped (the recipe defaults); it reports
its seconds, its peak RSS above the RSS before the extraction, whether what it got is mapped, and a checksum of it.
The two trees' features must be equal. The CPU model and the load are recorded.

    python benchmarks/bench_parallel_extract.py --before REF [--quick] [--sizes 100000] [--dim 768]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import BENCHMARKS, Report, mib, parse_args

ROOT = BENCHMARKS.parent
BATCH = 256


class SyntheticImages:
    """N images of 8 × 8 pixels, image i a plain colour from i, label i % 10: what `extract` reads of a dataset."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key):
        from PIL import Image

        if key == "label":
            return [i % 10 for i in range(self.n)]
        i = int(key)
        return {"image": Image.new("RGB", (8, 8), (i % 251, (i // 251) % 251, 17)), "label": i % 10}


def trivial_backbone(dim: int):
    import torch
    from torch import nn

    from headprobe.backbones.base import IMAGENET_MEAN, IMAGENET_STD, Backbone, Preprocess

    torch.manual_seed(0)
    return Backbone(nn.Linear(3, dim), lambda model, pixels: model(pixels.mean(dim=(2, 3))), id="bench:trivial",
                    dim=dim, preprocess=Preprocess(resize=8, crop=8, mean=IMAGENET_MEAN, std=IMAGENET_STD)).freeze()


def worker(n: int, dim: int, out: str) -> None:
    """One process of the torchrun job: the measurement above, written to out/rank-<r>.json."""
    import hashlib

    import torch
    from _common import peak_rss_bytes, reset_peak_rss, rss_bytes

    from headprobe.features.extract import extract
    from headprobe.parallel.distributed import process_state

    state = process_state()
    backbone = trivial_backbone(dim)
    info = {"source": f"synthetic-{n}", "fingerprint": "bench", "test_split": None, "limit": None, "split_seed": 0}
    extract(backbone, SyntheticImages(2 * BATCH), data_info=info | {"source": "warm-up"}, split="train",
            batch_size=BATCH, cache=False, num_workers=0, state=state)
    base = rss_bytes()
    reset_peak_rss()
    start = time.perf_counter()
    got = extract(backbone, SyntheticImages(n), data_info=info, split="train", batch_size=BATCH, cache=True,
                  num_workers=0, mapped=True, state=state)
    seconds = time.perf_counter() - start
    peak = peak_rss_bytes()
    try:
        from headprobe.features.tensor_file import is_mapped

        mapped = is_mapped(got.features)
    except ImportError:
        mapped = False
    digest = hashlib.sha256()
    for s in range(0, n, 65_536):  # a chunk at a time, after the peak was read
        digest.update(got.features[s : s + 65_536].float().contiguous().numpy().tobytes())
    record = {"seconds": seconds, "rss_before_mib": mib(base), "peak_mib": mib(peak),
              "peak_above_before_mib": mib(peak - base), "mapped": mapped, "features_sha256": digest.hexdigest(),
              "dtype": str(got.features.dtype), "shape": list(got.features.shape)}
    Path(out, f"rank-{state.process_index}.json").write_text(json.dumps(record))
    del got
    torch.distributed.barrier()


def run_job(tree: Path, n: int, dim: int, folder: Path) -> list[dict]:
    """torchrun --nproc_per_node 2 of `worker` with headprobe from `tree` → each rank's record."""
    folder.mkdir(parents=True)
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{BENCHMARKS}", "HEADPROBE_CACHE": str(folder / "cache"),
           "OMP_NUM_THREADS": "1", "HEADPROBE_THREADS": "1"}
    code = f"import bench_parallel_extract as b; b.worker({n}, {dim}, {str(folder)!r})"
    script = folder / "job.py"
    script.write_text(f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r})\n{code}\n")
    done = subprocess.run([str(torchrun), "--nproc_per_node", "2", str(script)], env=env, capture_output=True,
                          text=True, cwd=folder)
    if done.returncode != 0:
        raise RuntimeError(f"the 2-process job from {tree} failed:\n{done.stderr[-3000:]}")
    return [json.loads((folder / f"rank-{r}.json").read_text()) for r in (0, 1)]


def main() -> None:
    def extra(parser):
        parser.add_argument("--before", metavar="REF", required=True, help="git revision of the gathering code")
        parser.add_argument("--sizes", type=int, nargs="+", default=None)
        parser.add_argument("--dim", type=int, default=768)

    args = parse_args(__doc__.splitlines()[0], repeats=1, quick_repeats=1, extra=extra)
    sizes = args.sizes or ([20_000] if args.quick else [100_000])
    from bench_startup import lscpu_model, source_tree

    report = Report("parallel_extract", args, {"N": sizes, "D": args.dim, "processes": 2, "batch": BATCH,
                                               "before": args.before})
    report.extra["lscpu_model"] = lscpu_model()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": source_tree(args.before, Path(tmp)), "now": ROOT}
        for n in sizes:
            records = {label: run_job(tree, n, args.dim, Path(tmp) / f"{label}-{n}") for label, tree in trees.items()}
            for label, ranks in records.items():
                report.timing(f"{label}: 2-process extraction of {n} x {args.dim}", [r["seconds"] for r in ranks],
                              peaks_mib=[r["peak_mib"] for r in ranks],
                              peaks_above_before_mib=[r["peak_above_before_mib"] for r in ranks],
                              mapped=[r["mapped"] for r in ranks])
            same = len({r["features_sha256"] for ranks in records.values() for r in ranks}) == 1
            before = max(r["peak_above_before_mib"] for r in records["before"])
            now = max(r["peak_above_before_mib"] for r in records["now"])
            matrix = mib(n * args.dim * 4)
            rows.append({"N": n, "D": args.dim, "features_mib": matrix, "before": records["before"],
                         "now": records["now"], "same_features": same,
                         "peak_above_before_mib": {"before": before, "now": now}})
            report.check(f"2-process extraction, N = {n}, D = {args.dim}: peak RSS per process above its start",
                         f"the gathered shards (revision {args.before})", "below the (N, D) float32 matrix, "
                         "identical features", f"{now:.0f} MiB vs {before:.0f} MiB (the matrix: {matrix:.0f} MiB); "
                         f"features {'identical' if same else 'DIFFERENT'}", now < matrix and same)
            print(f"N = {n}: peak above start per process {before:.0f} -> {now:.0f} MiB "
                  f"({before / max(now, 1.0):.1f}x less), the (N, D) matrix is {matrix:.0f} MiB")
    report.extra["rows"] = rows
    report.finish()


if __name__ == "__main__":
    main()
