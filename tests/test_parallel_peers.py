"""A multi-process run that loses a process says so (`headprobe.parallel.peers`): the survivor records status
"failed" naming the lost process and the stage, and `--resume` finishes the run."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from timeouts import HANG_TIMEOUT_S

from headprobe.parallel.peers import Peer, lost_peers, lost_sentence, process_runs


def test_a_dead_process_and_an_unreaped_zombie_no_longer_run():
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert process_runs(job.pid)
        os.kill(job.pid, signal.SIGKILL)
        deadline = time.monotonic() + HANG_TIMEOUT_S
        while process_runs(job.pid):  # a zombie until waited for: already gone
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert Path(f"/proc/{job.pid}").exists()  # not reaped yet
    finally:
        job.wait()
    assert not process_runs(job.pid)
    assert process_runs(os.getpid())


def test_only_processes_on_this_host_are_judged_lost():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    peers = [Peer(0, host, os.getpid()), Peer(1, host, dead.pid), Peer(2, "node-elsewhere", dead.pid)]
    assert lost_peers(peers, rank=0) == [peers[1]]
    assert lost_peers(peers[:1] + peers[2:], rank=0, wait_s=0.2) == []  # nothing local to look at: none found
    assert lost_sentence([peers[1]], 3, "running probe 'linear' on tap 'relu'") == (
        f"process 1 of 3 (pid {dead.pid} on {host}) was lost while running probe 'linear' on tap 'relu'")
    assert lost_sentence(peers[1:], 3, "after training heads").endswith("were lost after training heads")


def test_a_timed_out_collective_is_told_apart_and_its_timeout_comes_from_the_environment(monkeypatch):
    from headprobe.parallel.distributed import COLLECTIVE_TIMEOUT_S, collective_timeout_s
    from headprobe.parallel.peers import timed_out, timeout_sentence

    gloo = "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv operation"
    assert timed_out(f"RuntimeError: {gloo}") and not timed_out("RuntimeError: Connection closed by peer")
    monkeypatch.setenv("HEADPROBE_COLLECTIVE_TIMEOUT", "30")
    assert collective_timeout_s() == 30.0
    assert timeout_sentence(2, "running probe 'linear' on tap 'relu'") == (
        "a process of 2 did not answer within 30 s (HEADPROBE_COLLECTIVE_TIMEOUT) while running probe 'linear' on "
        "tap 'relu': it was stopped (SIGSTOP, a hung device) or fell that far behind")
    monkeypatch.setenv("HEADPROBE_COLLECTIVE_TIMEOUT", "")
    assert collective_timeout_s() == COLLECTIVE_TIMEOUT_S == 7200.0
    for bad in ("soon", "-5", "0", "inf"):
        monkeypatch.setenv("HEADPROBE_COLLECTIVE_TIMEOUT", bad)
        with pytest.warns(UserWarning, match=f"HEADPROBE_COLLECTIVE_TIMEOUT = '{bad}' is not a positive number"):
            assert collective_timeout_s() == COLLECTIVE_TIMEOUT_S


# --- under torchrun -------------------------------------------------------------------------------------------

# Each process writes its pid, then both wait at the probe stage for the test to kill one. SIGTERM (what torchrun
# sends the survivors once a process died) raises KeyboardInterrupt here, as headprobe's own handler would.
SCRIPT = """
import json, os, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
import headprobe.pipeline.probing as probing
from headprobe import run
folder = pathlib.Path(sys.argv[3])
probe_heads = probing.probe_heads
def held(*args, **kwargs):
    (folder / f"pid-{os.environ['RANK']}").write_text(str(os.getpid()))
    while not (folder / "go").exists():
        time.sleep(0.05)
    return probe_heads(*args, **kwargs)
probing.probe_heads = held
run(json.loads(sys.argv[1]), out=sys.argv[2], resume=len(sys.argv) > 4, quiet=True)
"""


def _start_two_processes(tiny_recipe: dict, tmp_path: Path, **env_extra: str):
    """SCRIPT under torchrun with 2 processes on a tiny run, returned once both have written their pid (each then
    waits at the probe stage for signals/go): (job, the argv to run it again, env, out, signals)."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    recipe = {**tiny_recipe, "data": {"source": "sklearn-digits", "limit": {"train": 101, "test": 37}},
              "heads": [{"name": "relu", "width": 16}], "augment": {"preset": "crop-flip", "views": 2},
              "train": {"epochs": 1, "batch_size": 32}, "probes": {"linear": {"C_grid": [0.1, 1.0]}}}
    out, signals = tmp_path / "run", tmp_path / "signals"
    signals.mkdir()
    argv = [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", "2", str(script), json.dumps(recipe),
            str(out), str(signals)]
    env = {**os.environ, "HEADPROBE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", **env_extra}
    job = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + HANG_TIMEOUT_S
        while not all((signals / f"pid-{rank}").exists() for rank in (0, 1)):
            assert job.poll() is None, job.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the run never reached the probe stage"
            time.sleep(0.1)
        time.sleep(0.5)  # both pid files are whole
    except BaseException:
        job.kill()
        raise
    return job, argv, env, out, signals


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="torchrun missing")
@pytest.mark.parametrize("killed", [1, 0])
def test_a_killed_process_is_recorded_by_the_survivor_and_resume_finishes(tiny_recipe, tmp_path, killed):
    job, argv, env, out, signals = _start_two_processes(tiny_recipe, tmp_path)
    try:
        victim = int((signals / f"pid-{killed}").read_text())
        os.kill(victim, signal.SIGKILL)
        _, err = job.communicate(timeout=HANG_TIMEOUT_S)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode != 0
    failed = json.loads((out / "results.json").read_text())
    assert failed["status"] == "failed", (failed["status"], failed.get("error"), err[-3000:])
    message = failed["error"]["message"]
    assert message.startswith(f"process {killed} of 2 (pid {victim} on {socket.gethostname()}) was lost "), message
    assert "training heads" in message and "--resume" in message
    assert "relu" not in failed["taps"]  # killed before the head taps were probed
    (signals / "go").touch()
    done = subprocess.run([*argv, "--resume"], env=env, capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = json.loads((out / "results.json").read_text())
    assert resumed["status"] == "complete" and set(resumed["taps"]) == {"backbone", "relu@1", "relu"}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="torchrun missing")
def test_a_stopped_process_fails_the_run_after_the_collective_timeout(tiny_recipe, tmp_path):
    """SIGSTOP on process 1 at the probe stage: process 0 waits in its next collective for HEADPROBE_COLLECTIVE_TIMEOUT
    (60 s here, far above any wait of this run), then records "failed" with the sentence, not "running" forever."""
    job, _, _, out, signals = _start_two_processes(tiny_recipe, tmp_path, HEADPROBE_COLLECTIVE_TIMEOUT="60")
    stopped = None
    try:
        stopped = int((signals / "pid-1").read_text())
        os.kill(stopped, signal.SIGSTOP)
        (signals / "go").touch()  # process 0 goes on to the probes' first exchange and waits there
        deadline = time.monotonic() + HANG_TIMEOUT_S
        while json.loads((out / "results.json").read_text())["status"] == "running":
            assert time.monotonic() < deadline, "the stopped process was waited for forever"
            time.sleep(0.5)
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGKILL)
        job.communicate(timeout=HANG_TIMEOUT_S)
    failed = json.loads((out / "results.json").read_text())
    assert failed["status"] == "failed"
    assert failed["error"]["message"].startswith(
        "a process of 2 did not answer within 60 s (HEADPROBE_COLLECTIVE_TIMEOUT)"), failed["error"]
