"""Head training on a memory-mapped view cache larger than what a run should hold: peak memory and throughput.

A synthetic view cache of N images x K views x D float32 features (default N = 1,000,000, K = 4, D = 384: 6.1 GB) is
written to disk in chunks (`feature_cache.save_cached_streamed`), then:

1. peak memory: a fresh process loads it memory-mapped (`feature_cache.load_cached(mapped=True)`: every tensor's
   checksum verified over the file in chunks) and trains 3 heads for one epoch (`train.train_heads`, each batch's
   rows read from the file by `tensor_file.gather_rows`); its whole peak RSS (`ru_maxrss`: imports, checksum
   verification and training, mapped file pages included) against 2 GiB;
2. throughput: in one process, training steps on the mapped N-image cache against the same steps on an in-memory
   subset of N_subset images that fits (the bare tensor, nothing mapped), timed alternately.

The file lives in the page cache after it is written when the machine has the memory for it (the numbers say which
pages were resident); on a cache truly larger than RAM each batch's 2·B rows come from the disk, at its random-read
rate. The file is deleted at the end.

    python benchmarks/bench_memmap.py [--quick] [--n N] [--folder DIR]
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import Report, device, interleaved, mib, parse_args, timed, worker_code

K, D, BATCH, SEED = 4, 384, 256, 0
PARAMS = 3  # a small params tensor next to the features, as the cache stores it
RSS_TARGET_BYTES, THROUGHPUT_TARGET = 2 * 2**30, 0.8
CHUNK_IMAGES = 8192  # images generated and written at a time (48 MiB of features)
KEY = "bench-memmap"


def head_specs() -> list:
    from headprobe.recipe import HeadSpec

    return [HeadSpec(name="relu_bn", act="relu", width=512, out_dim=256),
            HeadSpec(name="swish", act="swish", width=512, out_dim=256, bn_hidden=False),
            HeadSpec(name="linear", type="linear", width=512, out_dim=256)]


def chunks(n: int, width: int, seed: int):
    """Rows of the synthetic cache, CHUNK_IMAGES images at a time: a per-image centre plus per-view noise."""
    for start in range(0, n, CHUNK_IMAGES):
        g = torch.Generator().manual_seed(seed * 1_000_003 + start)
        rows = min(CHUNK_IMAGES, n - start)
        yield torch.randn(rows, 1, width, generator=g) + 0.3 * torch.randn(rows, K, width, generator=g)


def write_cache(path: Path, n: int) -> float:
    from headprobe.features.cache import save_cached_streamed

    zeros = (torch.zeros(min(CHUNK_IMAGES, n - s), K, PARAMS) for s in range(0, n, CHUNK_IMAGES))
    seconds, ok = timed(lambda: save_cached_streamed(
        path, KEY, {"synthetic": True}, {"features": (torch.float32, (n, K, D), chunks(n, D, SEED)),
                                         "params": (torch.float32, (n, K, PARAMS), zeros)}))
    if not ok:
        raise SystemExit(f"could not write {path}")
    return seconds


def train(views: torch.Tensor, steps: int | None, epochs: int = 1):
    from headprobe.recipe import TrainSpec
    from headprobe.train.cached_views import train_heads

    spec = TrainSpec(epochs=epochs, steps=steps, batch_size=BATCH, lr=1e-3, log_every=10**9)
    return train_heads(head_specs(), views, objective_name="vicreg", objective_options={}, train=spec, seed=SEED,
                       device=device())


def resident_bytes(path: str) -> int | None:
    """Bytes of `path`'s mapping resident in this process (/proc/self/smaps), or None where it cannot be read."""
    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return None
    total, inside = 0, False
    for line in text.splitlines():
        if line and line[0] in "0123456789abcdef" and "-" in line.split()[0]:
            inside = line.rstrip().endswith(path)
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def mapped_epoch_worker(path: str, n: int) -> None:
    """In this fresh process: load the cache mapped, train 3 heads one epoch; print times and peak RSS as JSON."""
    from headprobe.features.cache import load_cached

    t0 = time.perf_counter()
    views, _ = load_cached(Path(path), KEY, n, mapped=True)
    load_s = time.perf_counter() - t0
    after_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    seconds, (_, summary) = timed(lambda: train(views, None))
    print(json.dumps({"n": n, "load_and_verify_s": load_s, "train_s": seconds, "steps": summary["steps"],
                      "maxrss_after_load_bytes": after_load,
                      "maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "mapped_resident_at_end_bytes": resident_bytes(path)}))


def main() -> None:
    import argparse

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--n", type=int, default=None, help="images in the synthetic cache (default 1,000,000)")
    extra.add_argument("--folder", type=Path, default=Path(tempfile.gettempdir()), help="where the cache is written")
    own, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    args = parse_args(__doc__.splitlines()[0])
    n = own.n or (50_000 if args.quick else 1_000_000)
    n_subset = min(n, 100_000)
    steps = 60 if args.quick else 300
    size = n * K * D * 4
    free = shutil.disk_usage(own.folder).free
    if free < 1.5 * size:
        raise SystemExit(f"{own.folder} has {free / 2**30:.1f} GiB free; the cache needs {size / 2**30:.1f} GiB "
                         "(and a margin): use --folder DIR or a smaller --n.")
    report = Report("memmap", args, {"n": n, "k": K, "d": D, "cache_bytes": size, "batch_size": BATCH,
                                     "heads": [h.name for h in head_specs()], "n_subset_in_memory": n_subset,
                                     "throughput_steps": steps})
    folder = Path(tempfile.mkdtemp(prefix="headprobe-memmap-", dir=own.folder))
    path = folder / "views.safetensors"
    try:
        write_s = write_cache(path, n)
        print(f"   wrote {size / 2**30:.2f} GiB in {write_s:.1f} s", flush=True)
        out = subprocess.run([sys.executable, "-c", worker_code("bench_memmap", f"mapped_epoch_worker({str(path)!r}, "
                                                                f"{n})")], check=True, capture_output=True, text=True)
        epoch = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"   mapped epoch: {epoch['steps']} steps in {epoch['train_s']:.1f} s; load + verify "
              f"{epoch['load_and_verify_s']:.1f} s; peak RSS {mib(epoch['maxrss_bytes'])} MiB", flush=True)
        report.check(f"peak RSS, one epoch of 3 heads on a mapped {n:,} x {K} x {D} view cache "
                     f"({size / 2**30:.1f} GiB)", "2 GiB", "<= 2 GiB",
                     f"{mib(epoch['maxrss_bytes'])} MiB (whole process; after load + verify "
                     f"{mib(epoch['maxrss_after_load_bytes'])} MiB)", epoch["maxrss_bytes"] <= RSS_TARGET_BYTES,
                     peak_rss_bytes=epoch["maxrss_bytes"])

        from headprobe.features.cache import load_cached

        mapped, _ = load_cached(path, KEY, n, mapped=True)
        subset = torch.cat(list(chunks(n_subset, D, SEED)))  # the same first n_subset images, in memory
        train(mapped, 5), train(subset, 5)  # warm-up
        times, _ = interleaved({"mapped": lambda: train(mapped, steps), "memory": lambda: train(subset, steps)},
                               args.repeats)
        report.rate_check(f"head-training throughput, mapped {n:,}-image cache ({device().type})",
                          f"in-memory subset of {n_subset:,} images", THROUGHPUT_TARGET,
                          (f"{steps} steps, mapped cache of {n:,} images", times["mapped"]),
                          (f"{steps} steps, in-memory subset of {n_subset:,} images", times["memory"]), steps,
                          "steps", detail=f", 3 heads, B = {BATCH}")
        report.extra["mapped_epoch"] = epoch
        report.extra["derived"] = {"write_s": write_s, "write_gib_per_s": size / 2**30 / write_s,
                                   "epoch_images_per_s": epoch["steps"] * BATCH / epoch["train_s"],
                                   "epoch_steps_per_s": epoch["steps"] / epoch["train_s"]}
        load = os.getloadavg()
        report.note(f"Measured under load: the machine's {report.machine['cpus_available']} CPUs were shared with "
                    f"other jobs (load average {load[0]:.1f} at the end). Both throughput methods are timed "
                    "alternately, so the load hits both.")
        report.note("The cache file was written just before, so its pages were in the kernel's page cache where the "
                    f"machine's memory ({report.machine['memory_gib']} GiB) allowed: the mapped steps' reads were "
                    "copies from the page cache, not disk reads. Each batch's 2 x B rows are read with one pread each "
                    "(tensor_file.gather_rows), so no mapped page becomes resident while training; peak RSS counts "
                    "the mapped pages the process touched (mapped_resident_at_end_bytes) and the checksum buffer.")
        if args.quick or own.n:
            report.note(f"Run at N = {n:,}, not the full 1,000,000 (the script's default).")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report.finish()


if __name__ == "__main__":
    main()
