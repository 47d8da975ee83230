"""benchmarks/bench_scale.py at a tiny size: it runs end to end, records every probe at every N with its time and
peak memory, the CPU kind and the load, and fits finite growth exponents (checked against an exact power law)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from timeouts import HANG_TIMEOUT_S

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_growth_exponent_is_the_log_log_slope(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_scale

    assert bench_scale.growth_exponent([10, 100, 1000], [3 * n**1.5 for n in (10, 100, 1000)]) == pytest.approx(1.5)
    assert bench_scale.growth_exponent([10], [1.0]) is None
    x, y = bench_scale.mixture(500, 8, seed=1)
    assert x.shape == (500, 8) and set(y.tolist()) == set(range(bench_scale.CLASSES))


def test_bench_scale_runs_at_a_tiny_size_and_records_every_field(tmp_path):
    subprocess.run([sys.executable, str(BENCHMARKS / "bench_scale.py"), "--quick", "--sizes", "300", "600",
                    "--dims", "16", "--threads", "1", "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    result = json.loads((tmp_path / "scale.quick.json").read_text())
    assert result["benchmark"] == "scale" and result["sizes"]["sizes"] == [300, 600]
    assert result["machine"]["cpu_kind"]["kind"] in ("amx", "avx512", "avx2", "other")
    assert len(result["machine"]["load_average_start"]) == 3 and len(result["machine"]["load_average_end"]) == 3
    rows = result["measurements"]
    assert {(r["probe"], r["n"]) for r in rows} == {(p, n) for p in ("knn", "linear", "spectrum") for n in (300, 600)}
    for row in rows:
        assert row["seconds"] > 0 and row["peak_rss_bytes"] > 0 and "peak_above_inputs_bytes" in row
    assert set(result["growth_exponents"]) == {"knn D=16", "linear D=16", "spectrum D=16"}
    for exponents in result["growth_exponents"].values():
        assert set(exponents) == {"time", "peak_rss", "peak_above_inputs"}
        assert all(math.isfinite(value) for value in exponents.values())
