"""Faults a user meets: `kill -9` in the middle of head training or of probing, then `--resume`, ends with the same
numbers as a run that was never interrupted (#18)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = """
import json, sys
from headprobe import run
run(json.loads(sys.argv[1]), out=sys.argv[2], resume=len(sys.argv) > 3, quiet=True)
"""

RECIPE = {
    "heads": [{"name": "relu", "act": "relu", "width": 16, "out_dim": 8}],
    "objective": {"name": "vicreg"},
    "augment": {"preset": "crop-flip", "views": 2},
    "train": {"epochs": 40, "batch_size": 50, "log_every": 4, "checkpoint_every": 8},
    "probes": {"linear": {"C_grid": [0.1, 1.0]}, "knn": {"ks": [5]}, "invariance": {}, "spectrum": {}},
    "report": False,
}


def _kill_when(recipe: dict, out: Path, ready, env: dict, timeout: float = 240.0) -> None:
    """Start the run in a subprocess and SIGKILL it as soon as `ready(out)` holds (no clean-up can run)."""
    job = subprocess.Popen([sys.executable, "-c", SCRIPT, json.dumps(recipe), str(out)], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    try:
        while not ready(out):
            if job.poll() is not None:
                pytest.fail(f"the run ended before the fault could be injected: {job.stderr.read()[-2000:]!r}")
            if time.monotonic() > deadline:
                pytest.fail("the run never reached the point of the fault")
            time.sleep(0.05)
        os.kill(job.pid, signal.SIGKILL)
    finally:
        job.wait(timeout=60)


def _checkpointed(out: Path) -> bool:
    return any((out / "checkpoints").glob("step-*.pt")) if (out / "checkpoints").is_dir() else False


def _probing_heads(out: Path) -> bool:
    path = out / "metrics.jsonl"
    return path.exists() and '"tap": "relu' in path.read_text(errors="replace")


def _run(recipe: dict, out: Path, env: dict, resume: bool = False) -> dict:
    """One run in its own process (every run of a comparison alike: the same threads, the same floating point)."""
    args = [sys.executable, "-c", SCRIPT, json.dumps(recipe), str(out)] + (["--resume"] if resume else [])
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "results.json").read_text())


@pytest.mark.parametrize("when", [_checkpointed, _probing_heads], ids=["training", "probing"])
def test_kill_9_then_resume_gives_the_uninterrupted_numbers(tiny_recipe, tmp_path, when):
    recipe = {**tiny_recipe, **RECIPE}
    env = {**os.environ, "HEADPROBE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    reference = _run(recipe, tmp_path / "reference", env)
    _kill_when(recipe, tmp_path / "killed", when, env)
    assert json.loads((tmp_path / "killed" / "results.json").read_text())["status"] == "running"  # no clean-up ran
    resumed = _run(recipe, tmp_path / "killed", env, resume=True)
    assert resumed["status"] == "complete"
    for name, tap in reference["taps"].items():
        assert resumed["taps"][name]["metrics"] == tap["metrics"], name
        assert resumed["taps"][name]["uncertainty"] == tap["uncertainty"], name
    assert resumed["buffer"] == reference["buffer"]
    assert not list((tmp_path / "killed").rglob("*.tmp"))  # nothing half-written is left behind
