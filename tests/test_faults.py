"""Faults a user meets: `kill -9` or Ctrl-C in the middle of feature extraction, head training or probing, then
`--resume`, ends with the same numbers as a run that was never interrupted; two runs filling one cold feature cache
at the same time agree and leave only whole files (#18)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import tiny_recipe_of
from timeouts import HANG_TIMEOUT_S

pytestmark = pytest.mark.slow

# Ctrl-C raises KeyboardInterrupt as in a terminal even when the suite runs in the background: a shell without job
# control starts background commands with SIGINT ignored, and Python then installs no handler of its own.
SCRIPT = """
import json, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from headprobe import run
run(json.loads(sys.argv[1]), out=sys.argv[2], resume=len(sys.argv) > 3, quiet=True)
"""

# One recipe for every fault: 6 views, so that extracting them takes seconds and a kill after the first cache file
# lands in the middle; 40 epochs (160 steps, a checkpoint every 8), so that a kill after a checkpoint lands in training.
RECIPE = {
    "heads": [{"name": "relu", "act": "relu", "width": 16, "out_dim": 8}],
    "objective": {"name": "vicreg"},
    "augment": {"preset": "crop-flip", "views": 6},
    "train": {"epochs": 40, "batch_size": 50, "log_every": 4, "checkpoint_every": 8},
    "probes": {"linear": {"C_grid": [0.1, 1.0]}, "knn": {"ks": [5]}, "invariance": {}, "spectrum": {}},
    "report": False,
}


def _env(cache: Path) -> dict:
    return {**os.environ, "HEADPROBE_CACHE": str(cache), "OMP_NUM_THREADS": "1"}


def _kill_when(recipe: dict, out: Path, ready, env: dict, sig=signal.SIGKILL) -> int:
    """Start the run in a subprocess and send it `sig` as soon as `ready(out)` holds: SIGKILL (no clean-up can run)
    or SIGINT (Ctrl-C). Returns the process's exit code."""
    job = subprocess.Popen([sys.executable, "-c", SCRIPT, json.dumps(recipe), str(out)], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + HANG_TIMEOUT_S
    try:
        while not ready(out):
            if job.poll() is not None:
                pytest.fail(f"the run ended before the fault could be injected: {job.stderr.read()[-2000:]!r}")
            if time.monotonic() > deadline:
                pytest.fail("the run never reached the point of the fault")
            time.sleep(0.05)
        os.kill(job.pid, sig)
    finally:
        code = job.wait(timeout=HANG_TIMEOUT_S)
    return code


def _checkpointed(out: Path) -> bool:
    return any((out / "checkpoints").glob("step-*.pt")) if (out / "checkpoints").is_dir() else False


def _probing_heads(out: Path) -> bool:
    path = out / "metrics.jsonl"
    return path.exists() and '"tap": "relu' in path.read_text(errors="replace")


def _run(recipe: dict, out: Path, env: dict, resume: bool = False) -> dict:
    """One run in its own process (every run of a comparison alike: the same threads, the same floating point)."""
    args = [sys.executable, "-c", SCRIPT, json.dumps(recipe), str(out)] + (["--resume"] if resume else [])
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def reference(tiny_dinov2, tmp_path_factory) -> tuple[dict, dict, Path]:
    """(recipe, results, warm cache) of the uninterrupted run that every fault below is compared with: run once.
    A test that needs the warm cache copies it (`_warm`), so that no test's faults can reach another's."""
    root = tmp_path_factory.mktemp("faults-reference")
    recipe = {**tiny_recipe_of(tiny_dinov2), **RECIPE}
    return recipe, _run(recipe, root / "run", _env(root / "cache")), root / "cache"


def _warm(cache: Path, into: Path) -> Path:
    """A copy of the reference's cache: the features and views extracted, so a fault lands in training or probing."""
    return Path(shutil.copytree(cache, into))


def _assert_same_numbers(resumed: dict, reference: dict, where: str = "") -> None:
    """Bit-identical metrics, intervals and verdicts, not approximately equal ones."""
    assert resumed["status"] == "complete", where
    assert list(resumed["taps"]) == list(reference["taps"]), where
    for name, tap in reference["taps"].items():
        assert resumed["taps"][name]["metrics"] == tap["metrics"], (where, name)
        assert resumed["taps"][name]["uncertainty"] == tap["uncertainty"], (where, name)
    assert resumed["buffer"] == reference["buffer"], where


@pytest.mark.parametrize("when", [_checkpointed, _probing_heads], ids=["training", "probing"])
def test_kill_9_then_resume_gives_the_uninterrupted_numbers(reference, tmp_path, when):
    recipe, expected, cache = reference
    env = _env(_warm(cache, tmp_path / "cache"))
    _kill_when(recipe, tmp_path / "killed", when, env)
    assert json.loads((tmp_path / "killed" / "results.json").read_text())["status"] == "running"  # no clean-up ran
    _assert_same_numbers(_run(recipe, tmp_path / "killed", env, resume=True), expected)
    assert not list((tmp_path / "killed").rglob("*.tmp"))  # nothing half-written is left behind


# --- extraction and the shared cache --------------------------------------------------------------------------

def _cache_files(cache: Path, folder: str) -> list[Path]:
    return sorted((cache / folder).glob("*.safetensors")) if (cache / folder).is_dir() else []


def _assert_cache_whole(cache: Path) -> None:
    """No temporary file is left, and every cache file passes its checksums (nothing partial was renamed in)."""
    from safetensors import safe_open

    from headprobe.features.cache import tensor_checksum

    assert not [p for p in cache.rglob("*") if p.name.endswith(".tmp")], sorted(cache.rglob("*"))
    files = list(cache.rglob("*.safetensors"))
    assert files
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            checksums = json.loads(f.metadata()["checksums"])
            for name, recorded in checksums.items():
                assert tensor_checksum(f.get_tensor(name), recorded.partition(":")[0]) == recorded, path


def test_kill_9_during_feature_extraction_then_resume_gives_the_uninterrupted_numbers(reference, tmp_path):
    recipe, expected, _ = reference
    cache = tmp_path / "cache"  # cold: the killed run extracts everything itself
    _kill_when(recipe, tmp_path / "killed", lambda out: bool(_cache_files(cache, "features")), _env(cache))
    assert not _cache_files(cache, "views"), "the run got past the extraction before the kill"
    killed = json.loads((tmp_path / "killed" / "results.json").read_text())
    assert killed["status"] == "running" and not killed["taps"]  # killed in extraction, before any probe
    _assert_same_numbers(_run(recipe, tmp_path / "killed", _env(cache), resume=True), expected)
    assert not list((tmp_path / "killed").rglob("*.tmp"))
    _assert_cache_whole(cache)


def test_ctrl_c_in_extraction_training_and_probing_is_recorded_and_resume_gives_the_same_numbers(reference, tmp_path):
    """Ctrl-C (SIGINT) at each stage: the run records "interrupted" with the stage, leaves no temporaries, and
    `--resume` ends with the uninterrupted run's metrics, intervals and verdict."""
    recipe, expected, cache = reference
    warm = _warm(cache, tmp_path / "cache-warm")
    moments = {"extraction": lambda cache: lambda out: bool(_cache_files(cache, "features")),
               "training": lambda cache: _checkpointed, "probing": lambda cache: _probing_heads}
    for stage, ready in moments.items():
        # A cold cache only where the kill must land in extraction; the others read the reference's warm one.
        cache = tmp_path / "cache-extraction" if stage == "extraction" else warm
        out = tmp_path / stage
        code = _kill_when(recipe, out, ready(cache), _env(cache), sig=signal.SIGINT)
        interrupted = json.loads((out / "results.json").read_text())
        assert code != 0 and interrupted["status"] == "interrupted", (stage, code, interrupted["status"])
        assert "KeyboardInterrupt" in interrupted["error"]["message"], stage
        assert not list(out.rglob("*.tmp")), stage
        _assert_same_numbers(_run(recipe, out, _env(cache), resume=True), expected, stage)


def test_two_runs_sharing_one_cold_cache_at_once_agree_and_leave_no_partial_files(reference, tmp_path):
    recipe, expected, _ = reference
    cache = tmp_path / "cache"
    jobs = {name: subprocess.Popen([sys.executable, "-c", SCRIPT, json.dumps(recipe), str(tmp_path / name)],
                                   env=_env(cache), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for name in ("first", "second")}
    for name, job in jobs.items():
        _, err = job.communicate(timeout=HANG_TIMEOUT_S)
        assert job.returncode == 0, (name, err[-3000:])
    first, second = (json.loads((tmp_path / name / "results.json").read_text()) for name in jobs)
    _assert_same_numbers(first, expected, "first")  # and both as a run alone with its own cache
    _assert_same_numbers(second, expected, "second")
    # Both extracted into the same files (one per key: train and test features, views); each was renamed in whole.
    assert len(_cache_files(cache, "features")) == 2 and _cache_files(cache, "views")
    # The same features and cache keys; whether a run found the other's file already written ("hit") depends on timing.
    def without_hits(protocol: dict) -> dict:
        return {**protocol, "cache": {split: {k: v for k, v in entry.items() if k != "hit"}
                                      for split, entry in protocol.get("cache", {}).items()}}

    assert without_hits(first["protocol"]["features"]) == without_hits(second["protocol"]["features"])
    _assert_cache_whole(cache)
