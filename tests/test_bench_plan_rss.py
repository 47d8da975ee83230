"""benchmarks/bench_plan_rss.py at a tiny size: it runs a recipe cold in a child process, records the measured peak
RSS beside `headprobe plan`'s estimate, and the planned cache bytes equal the data bytes of the files written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from timeouts import HANG_TIMEOUT_S

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_bench_plan_rss_runs_a_tiny_recipe_and_records_estimate_and_peak(tmp_path):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "tiny", "backbone": {"id": "scratch:vit-tiny", "pooling": "cls"},
        "data": {"source": "sklearn-digits"}, "features": {"batch_size": 50},
        "probes": {"knn": {"ks": [5]}}, "report": False}))
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_plan_rss.py"), "--quick", "--recipes", str(recipe),
                           "--threads", "1", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "plan_rss.quick.json").read_text())
    (timing,) = result["timings"].values()
    assert timing["peak_rss_bytes"] > 50 * 2**20 and timing["estimate_bytes"] > 0 and timing["cache_files"] >= 1
    checks = {row["benchmark"].split(",")[0]: row for row in result["checks"]}
    assert 0.6 < checks["plan peak RSS"]["ratio"] < 1.6  # 0.94 here (Xeon AMX); the 25% target: real recipes
    assert checks["plan cache bytes"]["met"], checks["plan cache bytes"]["measured"]
