"""The run-folder lock (`record/lock.py`): a second command writing into a locked run folder stops at once (exit 2)
naming the holder, and the first's results stay whole; a lock left by a dead process is taken over with a warning."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from timeouts import HANG_TIMEOUT_S

from headprobe.recipe import RecipeError
from headprobe.record.lock import LOCK_NAME, RunFolderLocked, RunLock, folder_lock


def _dead_pid() -> int:
    job = subprocess.Popen([sys.executable, "-c", "pass"])
    job.wait()
    return job.pid


def _plant(folder: Path, host: str, pid: int, age_s: float = 0.0) -> Path:
    """A lock file as another command would have left it, its heartbeat `age_s` seconds old."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    path.write_text(json.dumps({"pid": pid, "host": host, "purpose": "run", "started": "2026-12-01 10:00:00 UTC",
                                "token": "planted"}))
    when = time.time() - age_s
    os.utime(path, (when, when))
    return path


def test_a_held_folder_is_refused_with_its_holder_named_and_released_after(tmp_path):
    run = tmp_path / "run"
    with RunLock(run, "run") as lock:
        holder = json.loads((run / LOCK_NAME).read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with pytest.raises(RunFolderLocked) as refused:
            RunLock(run, "report").acquire()
        message = str(refused.value)
        assert f"pid {os.getpid()} on host {socket.gethostname()}" in message
        assert f"started {holder['started']}" in message and "headprobe run" in message
        assert "--out" in message and f"delete {run / LOCK_NAME}" in message
        assert lock.owner is not None
    assert not (run / LOCK_NAME).exists()
    with RunLock(run, "report"):  # free again
        pass


def test_a_lock_whose_process_is_gone_on_this_host_is_taken_over_with_a_warning(tmp_path):
    run = tmp_path / "run"
    _plant(run, socket.gethostname(), _dead_pid())
    with pytest.warns(UserWarning, match="its process no longer runs"), RunLock(run, "resume"):
        assert json.loads((run / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_a_live_process_on_this_host_holds_its_lock_however_old_its_heartbeat(tmp_path):
    run = tmp_path / "run"
    _plant(run, socket.gethostname(), os.getppid(), age_s=10_000)  # a stopped (SIGSTOP) run keeps its folder
    with pytest.raises(RunFolderLocked, match=f"pid {os.getppid()}"):
        RunLock(run, "run").acquire()


def test_another_hosts_lock_is_stale_only_after_its_heartbeat_timed_out(tmp_path, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.setenv("HEADPROBE_LOCK_TIMEOUT", "60")
    _plant(run, "node-elsewhere", 1234, age_s=5)  # its pid means nothing here: only the heartbeat counts
    with pytest.raises(RunFolderLocked, match="pid 1234 on host node-elsewhere"):
        RunLock(run, "run").acquire()
    _plant(run, "node-elsewhere", 1234, age_s=600)
    with pytest.warns(UserWarning, match=r"node-elsewhere.*no heartbeat for 6\d\d s"), RunLock(run, "run"):
        assert json.loads((run / LOCK_NAME).read_text())["host"] == socket.gethostname()


def test_the_heartbeat_keeps_a_held_lock_fresh(tmp_path, monkeypatch):
    import headprobe.record.lock as lock_module

    monkeypatch.setattr(lock_module, "HEARTBEAT_S", 0.05)
    run = tmp_path / "run"
    with RunLock(run, "run"):
        old = time.time() - 1000
        os.utime(run / LOCK_NAME, (old, old))
        deadline = time.monotonic() + HANG_TIMEOUT_S
        while (run / LOCK_NAME).stat().st_mtime < old + 500:
            assert time.monotonic() < deadline, "the heartbeat never touched the lock"
            time.sleep(0.05)


def test_a_folder_the_lock_created_is_removed_when_left_empty(tmp_path):
    with folder_lock(tmp_path / "new" / "run", "run"):
        assert (tmp_path / "new" / "run" / LOCK_NAME).exists()
    assert not (tmp_path / "new").exists()


def test_a_bad_timeout_is_refused_with_a_sentence(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADPROBE_LOCK_TIMEOUT", "soon")
    _plant(tmp_path, "node-elsewhere", 1)
    with pytest.raises(RecipeError, match="HEADPROBE_LOCK_TIMEOUT = 'soon' is not a number"):
        RunLock(tmp_path, "run").acquire()


# --- commands colliding on one folder ----------------------------------------------------------------------------

# The first run waits inside the training stage until the test opens the gate: every other command meets it there.
HELD = """
import pathlib, sys, time
import headprobe.pipeline.stages as stages
train = stages.train_heads
def held(*args, **kwargs):
    pathlib.Path(sys.argv[3]).touch()
    while not pathlib.Path(sys.argv[4]).exists():
        time.sleep(0.05)
    return train(*args, **kwargs)
stages.train_heads = held
from headprobe.cli import main
sys.exit(main(["run", sys.argv[1], "--out", sys.argv[2]]))
"""


def _headprobe(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "headprobe", *args], env=env, capture_output=True, text=True,
                          timeout=HANG_TIMEOUT_S)


@pytest.mark.slow
def test_commands_meeting_a_running_run_exit_2_naming_it_and_its_results_stay_whole(tiny_recipe, tmp_path):
    recipe = {**tiny_recipe, "heads": [{"name": "relu", "act": "relu", "width": 16, "out_dim": 8}],
              "objective": {"name": "vicreg"}, "augment": {"preset": "crop-flip", "views": 2},
              "train": {"epochs": 2, "batch_size": 50}, "probes": {"linear": {"C_grid": [0.1, 1.0]}}}
    path, out = tmp_path / "recipe.yaml", tmp_path / "R"
    path.write_text(yaml.safe_dump(recipe))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen([sys.executable, "-c", HELD, str(path), str(out), str(tmp_path / "held"),
                              str(tmp_path / "gate")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        deadline = time.monotonic() + HANG_TIMEOUT_S
        while not (tmp_path / "held").exists():
            assert first.poll() is None, first.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the first run never reached training"
            time.sleep(0.1)
        before = (out / "results.json").read_text()
        for command in (["run", str(path), "--out", str(out)], ["run", str(path), "--out", str(out), "--resume"],
                        ["report", str(out)], ["geometry", str(out)]):
            done = _headprobe(*command, env=env)
            assert done.returncode == 2, (command, done.stderr[-3000:])
            assert "Traceback" not in done.stderr, command
            assert f"is in use by headprobe run (pid {first.pid} on host {socket.gethostname()}" in done.stderr, (
                command, done.stderr)
            assert "started 20" in done.stderr and "wait for it to finish" in done.stderr, command
        assert (out / "results.json").read_text() == before  # nothing the others did reached the folder
        assert not (out / "report.html").exists()
    finally:
        (tmp_path / "gate").touch()
        _, err = first.communicate(timeout=HANG_TIMEOUT_S)
    assert first.returncode == 0, err[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "complete" and set(results["taps"]) == {"backbone", "relu@1", "relu"}
    probes = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    probed = [(r["tap"], r["probe"]) for r in probes if r.get("stage") == "probe"]
    assert len(probed) == len(set(probed)) == 3  # one linear probe per tap: nobody else logged into the folder
    assert not (out / LOCK_NAME).exists()
    done = _headprobe("report", str(out), env=env)  # the folder is free once the run is over
    assert done.returncode == 0, done.stderr[-3000:]
