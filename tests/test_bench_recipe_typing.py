"""benchmarks/bench_recipe_typing.py at its quick size: every bad recipe it lists is refused by headprobe's checker
with the fix named (the benchmark's own claim), and the results file records both checkers per case."""

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_every_bad_recipe_is_refused_with_its_fix_named(tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_recipe_typing.py"), "--quick", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=BENCHMARKS)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "recipe_typing.quick.json").read_text())
    assert len(result["cases"]) == 14
    for case in result["cases"]:
        assert case["headprobe"]["refused"] and case["headprobe"]["names_fix"], case
        assert set(case["pydantic"]) == {"refused", "names_fix", "message"}
    ours = next(c for c in result["checks"] if c["benchmark"].startswith("headprobe"))
    assert ours["met"] and ours["refused"] == ours["names_fix"] == 14
