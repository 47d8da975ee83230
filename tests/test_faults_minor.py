"""The minor faults of #40: `validate` checks the environment variables a run reads, `submit` refuses options it
cannot honour before anything is submitted, and a warning prints as one clean line, once."""

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest
import yaml
from timeouts import HANG_TIMEOUT_S

from headprobe.cli import main


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    return " ".join(err.split())


@pytest.mark.parametrize("name, value, words", [
    ("HEADPROBE_THREADS", "abc", "HEADPROBE_THREADS='abc' is not a thread count; set it to a whole number >= 1"),
    ("HEADPROBE_THREADS", "0", "HEADPROBE_THREADS='0' is not a thread count"),
    ("OMP_NUM_THREADS", "-2", "OMP_NUM_THREADS='-2' is not a thread count"),
    ("HEADPROBE_LOCK_TIMEOUT", "abc", "HEADPROBE_LOCK_TIMEOUT = 'abc' is not a number of seconds"),
    ("HEADPROBE_LOCK_TIMEOUT", "-1", "HEADPROBE_LOCK_TIMEOUT = '-1' must be > 0 seconds"),
    ("HEADPROBE_PEER_TIMEOUT", "abc", "HEADPROBE_PEER_TIMEOUT = 'abc' is not a number of seconds; unset it or give "
                                      "e.g. HEADPROBE_PEER_TIMEOUT=300."),
    ("HEADPROBE_PEER_TIMEOUT", "0", "HEADPROBE_PEER_TIMEOUT = '0' must be > 0 seconds (e.g. 300)."),
    ("HEADPROBE_PEER_TIMEOUT", "-3", "HEADPROBE_PEER_TIMEOUT = '-3' must be > 0 seconds"),
    ("HEADPROBE_PEER_TIMEOUT", "nan", "HEADPROBE_PEER_TIMEOUT = 'nan' must be > 0 seconds"),
])
def test_validate_checks_the_environment_a_run_reads(name, value, words, tmp_path, capsys, monkeypatch):
    (tmp_path / "recipe.yaml").write_text("name: t\n")
    monkeypatch.setenv(name, value)
    assert main(["validate", str(tmp_path / "recipe.yaml")]) == 2
    assert words in _one_line(capsys)
    monkeypatch.delenv(name)
    assert main(["validate", str(tmp_path / "recipe.yaml")]) == 0


def test_validate_refuses_an_absurd_width_before_anything_allocates(tmp_path, capsys):
    (tmp_path / "recipe.yaml").write_text("heads: [{name: h, width: 1e11}]\n")
    assert main(["validate", str(tmp_path / "recipe.yaml")]) == 2
    assert "heads[0].width = '1e11' has the wrong type; expected an integer" in _one_line(capsys)


@pytest.mark.parametrize("args, words", [
    (["--mem-gb", "-5"], "--mem-gb = -5 is out of range; it must be > 0 GB"),
    (["--mem-gb", "0"], "--mem-gb = 0 is out of range"),
    (["--mem-gb", "inf"], "--mem-gb = inf is out of range"),
    (["--local", "--gpus", "4"], "--local --gpus 4 asks this machine for 4 GPU(s), but torch sees 0 here"),
])
def test_submit_refuses_options_it_cannot_honour_and_submits_nothing(args, words, tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)  # the same answer on a machine with GPUs
    (tmp_path / "recipe.yaml").write_text("name: t\n")
    monkeypatch.chdir(tmp_path)
    assert main(["submit", str(tmp_path / "recipe.yaml"), "--out", str(tmp_path / "run"), *args]) == 2
    assert words in _one_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe.yaml"]


def test_a_warning_prints_as_one_clean_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"schema_version": 3, "status": "complete",
                                                  "taps": {"backbone": {"metrics": {}}}}))
    lock = run / "headprobe.lock"
    lock.write_text(json.dumps({"pid": 4321, "host": "node-elsewhere", "purpose": "run", "started": "then"}))
    old = time.time() - 3600
    os.utime(lock, (old, old))
    env = {**os.environ, "HEADPROBE_LOCK_TIMEOUT": "60"}
    done = subprocess.run([sys.executable, "-m", "headprobe", "report", str(run)], env=env, capture_output=True,
                          text=True, timeout=HANG_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    warned = [line for line in done.stderr.splitlines() if "lock" in line]
    assert len(warned) == 1, done.stderr
    assert re.fullmatch(rf"warning: taking over the lock of {re.escape(str(run))} left by headprobe run \(pid 4321 on "
                        r"host node-elsewhere, started then\): it has had no heartbeat for 36\d\d s\.", warned[0])
    assert "UserWarning" not in done.stderr and ".py:" not in done.stderr
    assert socket.gethostname() != "node-elsewhere"


def test_validate_refuses_a_claims_primary_no_probe_of_the_recipe_measures(tmp_path, capsys):
    recipe = {"probes": {"linear": {}, "knn": {}}, "claims": {"Q-aug": {"primary": "rotation.acc"}}}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["validate", str(tmp_path / "recipe.yaml")]) == 2
    assert _one_line(capsys) == (
        "error: claims.Q-aug.primary = 'rotation.acc' is measured by probe rotation, which the recipe does not run "
        "(its probes: knn, linear); add probes.rotation, or choose a primary one of its probes measures.")
    recipe["probes"]["rotation"] = {}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["validate", str(tmp_path / "recipe.yaml")]) == 0


@pytest.mark.parametrize("key", ["width", "out_dim", "predictor"])
def test_validate_refuses_a_width_no_machine_can_hold(key, tmp_path, capsys):
    from headprobe.recipe.schema import MAX_WIDTH

    head = {"name": "h", "predictor": 8, key: 100_000_000_000}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump({"heads": [head], "objective": {"name": "simsiam"}}))
    assert main(["validate", str(tmp_path / "recipe.yaml")]) == 2
    assert f"heads[0].{key} = 100000000000 is out of range; it must be in [1, {MAX_WIDTH}]" in _one_line(capsys)
    assert main(["validate", "--set", f"heads.0.{key}={MAX_WIDTH}", str(tmp_path / "recipe.yaml")]) == 0
