"""`headprobe plan`'s peak-RSS estimate against the measured peak of real runs (target: within 25%), and its
feature-cache bytes against the files the run wrote.

Each recipe runs cold as `python -m headprobe run RECIPE --out TMP` in a fresh process with its own empty
HEADPROBE_CACHE; its peak RSS is that process's ru_maxrss (and its waited-for children's), read with os.wait4 when it
exits. The plan is computed from the same recipe (and --set values) beforehand, without torch.

    python benchmarks/bench_plan_rss.py [--quick] [--recipes recipes/quickstart.yaml recipes/offline_whiten.yaml]

--quick runs quickstart at data.limit {train: 300, test: 100} and one seed (a check that the script works).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import Report, parse_args

from headprobe.pipeline.plan import make_plan
from headprobe.recipe import load_recipe

ROOT = Path(__file__).resolve().parent.parent
TARGET = 0.25
QUICK = ["data.limit.train=300", "data.limit.test=100", "seeds=[0]"]


def measure(recipe: str, overrides: list[str]) -> dict:
    """Run `recipe` cold in a child process; its peak RSS, seconds and the bytes of the cache files it wrote."""
    with tempfile.TemporaryDirectory(prefix="plan_rss_") as tmp:
        env = {**os.environ, "HEADPROBE_CACHE": str(Path(tmp) / "cache"), "PYTHONPATH": str(ROOT)}
        argv = [sys.executable, "-m", "headprobe", "run", recipe, "--out", str(Path(tmp) / "run")]
        for item in overrides:
            argv += ["--set", item]
        t0 = time.perf_counter()
        child = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True)
        stderr = child.stderr.read()
        # os.wait4: this child's own rusage (RUSAGE_CHILDREN would be the largest peak of every child so far)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - t0
        if child.returncode != 0:
            raise SystemExit(f"{recipe} failed ({child.returncode}): {stderr[-1500:]}")
        peak = usage.ru_maxrss
        cache = Path(tmp) / "cache"
        files = [p for p in cache.rglob("*.safetensors") if p.parent.name in ("features", "views")]
        return {"peak_rss_bytes": peak * 1024, "seconds": round(seconds, 1),
                "cache_bytes": sum(p.stat().st_size for p in files), "cache_files": len(files)}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], extra=lambda p: p.add_argument(
        "--recipes", nargs="+", default=["recipes/quickstart.yaml", "recipes/offline_whiten.yaml"]))
    recipes = args.recipes[:1] if args.quick else args.recipes
    overrides = QUICK if args.quick else []
    report = Report("plan_rss", args, {"recipes": recipes, "overrides": overrides})
    for recipe in recipes:
        plan = make_plan(load_recipe(recipe, overrides))
        estimate = plan.rss["peak_bytes"]
        measured = measure(recipe, overrides)
        ratio = estimate / measured["peak_rss_bytes"]
        mib = 2**20
        info = {k: v for k, v in measured.items() if k != "seconds"}
        report.timing(f"{recipe} cold run", [measured["seconds"]], **info, estimate_bytes=estimate,
                      estimate_terms=plan.rss["terms"], estimate_cache_bytes=plan.totals["disk_bytes"])
        report.check(f"plan peak RSS, {recipe}{' (quick)' if args.quick else ''}", "measured peak RSS (ru_maxrss)",
                     f"within {TARGET:.0%}", f"{ratio:.2f} ({estimate / mib:.0f} vs "
                     f"{measured['peak_rss_bytes'] / mib:.0f} MiB)", abs(ratio - 1) <= TARGET, ratio=ratio)
        headers = measured["cache_bytes"] - plan.totals["disk_bytes"]
        report.check(f"plan cache bytes, {recipe}", "the cache files written", "data exact (headers extra)",
                     f"{plan.totals['disk_bytes']:,} B planned, {measured['cache_bytes']:,} B in "
                     f"{measured['cache_files']} files ({headers:,} B of headers)",
                     0 <= headers <= 4096 * measured["cache_files"])
        print(f"{recipe}: estimate {estimate / mib:.0f} MiB, measured {measured['peak_rss_bytes'] / mib:.0f} MiB, "
              f"ratio {ratio:.2f}", flush=True)
    report.finish()


if __name__ == "__main__":
    main()
