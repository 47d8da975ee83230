"""What every benchmark script shares: arguments, the machine description, timing, peak memory, the results file.

A script builds a `Report`, records timings and checks into it, and calls `finish()`, which prints the table and
writes ``benchmarks/results/<name>.json`` (``<name>.quick.json`` for ``--quick``, so a quick run never replaces the
full numbers the README quotes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

BENCHMARKS = Path(__file__).resolve().parent
RESULTS = BENCHMARKS / "results"
_threads: int | None = None  # --threads, passed on to the worker processes a script starts
_limits = None


def parse_args(description: str, repeats: int = 3, quick_repeats: int = 3, extra=None) -> argparse.Namespace:
    """The options every benchmark takes; `extra(parser)`, when given, adds a script's own."""
    parser = argparse.ArgumentParser(description=description)
    if extra is not None:
        extra(parser)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a check that the script runs")
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"timed repeats per method (default {repeats}, {quick_repeats} with --quick)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results JSON")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch and every BLAS/OpenMP pool (default: the libraries' own)")
    args = parser.parse_args()
    if args.repeats is None:
        args.repeats = quick_repeats if args.quick else repeats
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}.")
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be at least 1, got {args.threads}.")
        limit_threads(args.threads)
    return args


def limit_threads(n: int) -> None:
    """n threads for torch and for every BLAS/OpenMP pool, including those loaded later (scipy's OpenBLAS and
    sklearn's OpenMP load on first use and read the environment then) and those of worker processes."""
    from threadpoolctl import threadpool_limits

    global _threads, _limits
    _threads = n
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(n)
    torch.set_num_threads(n)
    _limits = threadpool_limits(limits=n)  # the pools already loaded; kept referenced so the limit lasts


def worker_code(module: str, call: str) -> str:
    """Python source for `python -c` that runs `module.call` in a fresh process with this process's --threads."""
    lines = [f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r})"]
    if _threads is not None:
        lines.append(f"import _common; _common.limit_threads({_threads})")
    lines.append(f"import {module}; {module}.{call}")
    return "\n".join(lines)


def device() -> torch.device:
    """The GPU when there is one, else the CPU: the scripts run unchanged on either."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def thread_pools() -> list[dict[str, Any]]:
    """Every BLAS/OpenMP thread pool loaded in this process, with its library file and thread count."""
    from threadpoolctl import threadpool_info

    return [{"api": pool["internal_api"], "library": Path(pool["filepath"]).name, "threads": pool["num_threads"]}
            for pool in threadpool_info()]


def machine() -> dict[str, Any]:
    """Platform, CPU, memory, library versions, device and the load average now (the machine may be shared)."""
    import numpy
    import sklearn

    dev = device()
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": _memory_gib(),
        "torch": torch.__version__,
        "sklearn": sklearn.__version__,
        "numpy": numpy.__version__,
        "device": str(dev),
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(wall seconds, result) of one call, GPU work included."""
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - start, out


def interleaved(methods: dict[str, Callable[[], Any]], repeats: int) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Time each method `repeats` times, alternating between them so that a change in the machine's load hits
    all of them alike. Returns ({name: [seconds, ...]}, {name: last result})."""
    times: dict[str, list[float]] = {name: [] for name in methods}
    results: dict[str, Any] = {}
    for _ in range(repeats):
        for name, fn in methods.items():
            seconds, results[name] = timed(fn)
            times[name].append(seconds)
    return times, results


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def reset_peak_rss() -> bool:
    """Reset this process's peak resident set size (Linux: write 5 to /proc/self/clear_refs); False if impossible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """Peak resident set size of this process since start or the last `reset_peak_rss` (VmHWM, else ru_maxrss)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_bytes() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return peak_rss_bytes()


def mib(n_bytes: float) -> float:
    return round(n_bytes / 2**20, 1)


class Report:
    """One benchmark's results: sizes, timings (every repeat and the median), checks against targets, notes."""

    def __init__(self, name: str, args: argparse.Namespace, sizes: dict[str, Any]) -> None:
        self.name, self.args, self.sizes = name, args, sizes
        self.machine = machine()
        self.timings: dict[str, dict[str, Any]] = {}
        self.checks: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}
        self.notes: list[str] = []
        self.started = time.perf_counter()
        mode = "quick" if args.quick else "full"
        print(f"== {name} ({mode}; {args.repeats} repeats; load average {self.machine['load_average_start']} "
              f"on {self.machine['cpus_available']} CPUs; device {self.machine['device']})", flush=True)

    def timing(self, label: str, seconds: list[float], **info: Any) -> float:
        """Record every repeat of one measurement; returns the median."""
        value = median(seconds)
        self.timings[label] = {"median_s": value, "all_s": [round(s, 4) for s in seconds], **info}
        print(f"   {label}: median {value:.3f} s over {len(seconds)} ({', '.join(f'{s:.3f}' for s in seconds)})",
              flush=True)
        return value

    def check(self, benchmark: str, compared_with: str, target: str, measured: str, met: bool,
              **numbers: Any) -> None:
        """One row of the README table: what was measured against what, the target, the number, and the verdict."""
        self.checks.append({"benchmark": benchmark, "compared_with": compared_with, "target": target,
                            "measured": measured, "met": bool(met), **numbers})

    def rate_check(self, benchmark: str, compared_with: str, target: float, ours: tuple[str, list[float]],
                   theirs: tuple[str, list[float]], count: int, unit: str, detail: str = "") -> tuple[float, float]:
        """Two timings of the same `count` items (images, steps) and the check that ours is at least `target` times
        their rate: records both (with `<unit>_per_s`) and the row; returns the two medians."""
        key = f"{unit}_per_s"
        t_ours = self.timing(ours[0], ours[1], **{key: count / median(ours[1])})
        t_theirs = self.timing(theirs[0], theirs[1], **{key: count / median(theirs[1])})
        ratio = t_theirs / t_ours
        self.check(benchmark, compared_with, f">= {target:g}x",
                   f"{ratio:.2f}x ({count / t_ours:.1f} vs {count / t_theirs:.1f} {unit}/s{detail})",
                   ratio >= target, ratio=ratio)
        return t_ours, t_theirs

    def note(self, text: str) -> None:
        self.notes.append(text)

    def finish(self) -> Path:
        load_end = [round(x, 2) for x in os.getloadavg()]
        self.machine["load_average_end"] = load_end
        self.machine["thread_pools"] = thread_pools()  # at the end: libraries load on first use
        payload = {
            "benchmark": self.name,
            "mode": "quick" if self.args.quick else "full",
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "wall_s": round(time.perf_counter() - self.started, 1),
            "repeats": self.args.repeats,
            "machine": self.machine,
            "sizes": self.sizes,
            "timings": self.timings,
            "checks": self.checks,
            **self.extra,
            "notes": self.notes,
        }
        self.args.out.mkdir(parents=True, exist_ok=True)
        path = self.args.out / f"{self.name}{'.quick' if self.args.quick else ''}.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        tmp.replace(path)
        self._print(load_end, path)
        return path

    def _print(self, load_end: list[float], path: Path) -> None:
        headers = ("benchmark", "compared with", "target", "measured", "met?")
        rows = [(c["benchmark"], c["compared_with"], c["target"], c["measured"], "yes" if c["met"] else "NO")
                for c in self.checks]
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
        line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
        print(line)
        print("-" * len(line))
        for row in rows:
            print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
        for check in self.checks:
            if not check["met"]:
                print(f"TARGET MISSED: {check['benchmark']}: measured {check['measured']}, target {check['target']}.")
        for note in self.notes:
            print(f"note: {note}")
        print(f"load average {self.machine['load_average_start']} -> {load_end}; wrote {path}", flush=True)
