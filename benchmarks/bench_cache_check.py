"""What it costs to check, where the stages read them, that the memory-mapped cache files a run reads did not change
under it (`feature_cache.UnchangedCache`: each file's identity as every stage ends, `RunContext.stage`, its checksums
again at the end and otherwise at most 1/`FULL_CHECK_SHARE` of the time), on a warm quickstart run.

Measured inside the run, so the machine's load hits the check and the run alike: the seconds spent in the checks
against the run's wall time (target: at most 2 %), how many checks were made, how many were full checks, and what
one full check takes (what making every check in full would have cost is that times the checks). A first run,
not timed, warms the cache (HEADPROBE_CACHE, else a temporary folder).

    python benchmarks/bench_cache_check.py [--quick]
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from _common import Report, parse_args

TARGET = 0.02
RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "quickstart.yaml"
QUICK = {"seeds": None, "train.epochs": 2, "data.limit.train": 300, "data.limit.test": 120}


def measured_run(out: Path, overrides: dict) -> dict:
    """One quickstart run with every check timed: {"run_s", "checks": [(seconds, full)]}."""
    from headprobe.features import cache as feature_cache
    from headprobe.pipeline import run

    checks, real = [], feature_cache.changed_mappings

    def timed(tensors, checksums=True):
        start = time.perf_counter()
        try:
            return real(tensors, checksums)
        finally:
            checks.append((time.perf_counter() - start, checksums))

    feature_cache.changed_mappings = timed
    try:
        start = time.perf_counter()
        results = run(RECIPE, out=out, quiet=True, **overrides)
        run_s = time.perf_counter() - start
    finally:
        feature_cache.changed_mappings = real
    assert results["status"] == "complete"
    return {"run_s": run_s, "checks": checks, "hits": results["protocol"]["features"]["cache"]}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], repeats=1, quick_repeats=1)
    overrides = QUICK if args.quick else {}
    os.environ.setdefault("HEADPROBE_CACHE", tempfile.mkdtemp(prefix="headprobe-cache-"))
    report = Report("cache_check", args, {"recipe": "quickstart", "overrides": overrides,
                                          "cache": os.environ["HEADPROBE_CACHE"]})
    with tempfile.TemporaryDirectory() as folder:
        measured_run(Path(folder) / "warm-up", overrides)
        runs = [measured_run(Path(folder) / f"run-{i}", overrides) for i in range(args.repeats)]
    for r in runs:
        assert all(entry["hit"] for entry in r["hits"].values()), r["hits"]  # warm: every cache file was mapped
    spent = [sum(s for s, _ in r["checks"]) for r in runs]
    shares = [s / r["run_s"] for s, r in zip(spent, runs, strict=True)]
    full = [s for r in runs for s, checksums in r["checks"] if checksums]
    report.timing("warm quickstart run", [r["run_s"] for r in runs])
    report.timing("all checks of one run", spent, checks_made=[len(r["checks"]) for r in runs],
                  full_checks=[sum(1 for _, c in r["checks"] if c) for r in runs])
    one_full = report.timing("one full check (identity and checksums of every mapped file)", full)
    worst = max(shares)
    report.check("re-checking the mapped cache files as the stages read them (warm quickstart)",
                 "the run's wall time", f"<= {TARGET:.0%}", f"{worst:.3%} ({max(spent):.3f} s of "
                 f"{runs[shares.index(worst)]['run_s']:.1f} s)", worst <= TARGET, share=worst)
    report.extra["every_check_in_full_s"] = one_full * max(len(r["checks"]) for r in runs)
    load = os.getloadavg()
    report.note(f"Load average {load[0]:.1f} on {report.machine['cpus_available']} CPUs at the end; the checks and "
                "the run share it. Every cache file was a hit, memory-mapped (features.memory_map, the default).")
    report.finish()


if __name__ == "__main__":
    main()
