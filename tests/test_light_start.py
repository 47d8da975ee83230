"""The light commands (`--help`, `list`, `validate`, `plan`, `claims`, `report`) never import torch, transformers,
accelerate or scikit-learn: each runs in a fresh interpreter, which then lists the heavy modules it holds (none). Their
start-up times are measured in benchmarks/bench_startup.py, not here (a busy machine would make a time bound
flaky)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from report_run import results_dict, write_run
from timeouts import HANG_TIMEOUT_S

from headprobe.stats.answers import claims_record
from headprobe.stats.claims import answer_questions
from headprobe.stats.measures import tap_measures

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "accelerate", "sklearn", "timm", "open_clip", "datasets")
# Runs the CLI as `python -m headprobe ARGS` does, then prints the heavy modules now imported (argparse's --help
# exits through SystemExit).
PROBE = """
import json, sys
from headprobe.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as stop:
    code = stop.code
print(json.dumps({"code": code, "heavy": [m for m in HEAVY if m in sys.modules]}))
"""


def _run_with_claims(path: Path) -> Path:
    """A finished run whose results hold answers (Q-aug and Q-class) but no figures to draw beyond the basics."""
    results = results_dict()
    for key in ("orbits",):
        results.pop(key)
    taps = results["taps"]
    taps["backbone"]["metrics"]["rotation.acc"] = 0.80
    taps["mlp"]["metrics"]["rotation.acc"] = 0.70
    results["claims"] = claims_record(answer_questions(tap_measures(taps), {}, {"mlp": "mlp", "lin": "lin"}))
    return write_run(path, results, records=[])


@pytest.mark.parametrize("command", [["--help"], ["list"], ["validate", "recipes/quickstart.yaml"],
                                     # a sweep with the rotation probe and objective options; digits, which
                                     # every machine has (validate checks the data is there)
                                     ["validate", "recipes/scratch_guillotine.yaml", "--set",
                                      "data.source=sklearn-digits"], ["claims", "RUN"],
                                     ["plan", "recipes/quickstart.yaml"],
                                     ["plan", "recipes/offline_whiten.yaml", "--format", "json"],
                                     ["report", "RUN"]], ids=lambda c: " ".join(c))
def test_a_light_command_imports_no_heavy_library(command, tmp_path):
    run = _run_with_claims(tmp_path / "run")
    argv = [str(run) if a == "RUN" else a for a in command]
    code = f"HEAVY = {HEAVY!r}\n{PROBE}"
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=ROOT,
                          timeout=HANG_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome == {"code": 0, "heavy": []}, done.stderr[-2000:]


def test_a_probe_declaration_reads_without_torch_and_the_estimators_stay_public():
    """`headprobe.probes.knn` is the function even where the module of that name was imported first."""
    code = ("import sys\nfrom headprobe.registry import PROBES\n"
            "names = [entry.name for entry in PROBES]\nassert 'torch' not in sys.modules, 'torch'\n"
            "import headprobe.probes.knn\nfrom headprobe.probes import knn, linear_probe\n"
            "from headprobe.probes import knn as again\n"
            "print(callable(knn), knn is again, type(knn).__name__, names[:2])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          timeout=HANG_TIMEOUT_S)
    assert done.stdout.split() == ["True", "True", "function", "['linear',", "'knn']"], done.stderr[-2000:]
