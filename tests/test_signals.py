"""A scheduler's SIGTERM / SIGUSR1 handled like Ctrl-C (`parallel.signals`): recorded "interrupted", the training
steps done checkpointed, `--resume` ends with the uninterrupted numbers, and every invocation keeps its own timing."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from headprobe.parallel.signals import StopSignal, atomic_step, stop_signals


def _send(sig: int) -> None:
    assert signal.getsignal(sig) is not signal.SIG_DFL  # never send a default-handled signal to the test process
    os.kill(os.getpid(), sig)


def test_a_stop_signal_outside_a_step_raises_at_once_with_its_exit_code():
    with stop_signals(), pytest.raises(StopSignal) as stop:
        _send(signal.SIGUSR1)
    assert (stop.value.name, stop.value.exit_code) == ("SIGUSR1", 128 + signal.SIGUSR1)
    assert isinstance(stop.value, KeyboardInterrupt)  # every Ctrl-C path handles it
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # restored on the way out


def test_a_stop_signal_inside_a_step_waits_for_the_step_to_end():
    finished = []
    with stop_signals(), pytest.raises(StopSignal):
        for step in range(3):
            with atomic_step():
                if step == 1:
                    _send(signal.SIGTERM)
                finished.append(step)  # the rest of step 1 still runs
    assert finished == [0, 1]


def test_a_handler_the_caller_installed_is_left_alone():
    seen = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    try:
        with stop_signals():
            os.kill(os.getpid(), signal.SIGUSR1)
        assert seen == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, previous)


RECIPE = {
    "heads": [{"name": "relu", "act": "relu", "width": 16, "out_dim": 8}],
    "objective": {"name": "vicreg"},
    "augment": {"preset": "crop-flip", "views": 2},
    # No periodic checkpoint: a step-N file before the end can only be the one written when the signal arrived.
    "train": {"epochs": 60, "batch_size": 50, "log_every": 2},
    "probes": {"linear": {"C_grid": [0.1, 1.0]}, "knn": {"ks": [5]}},
}


def _cli(recipe: Path, out: Path, resume: bool = False) -> list[str]:
    return [sys.executable, "-m", "headprobe", "run", str(recipe), "--out", str(out)] + (["--resume"] * resume)


def _training_logged(out: Path) -> bool:
    path = out / "metrics.jsonl"
    return path.exists() and '"stage": "train"' in path.read_text(errors="replace")


@pytest.mark.slow
def test_sigterm_in_training_is_recorded_flushes_a_checkpoint_and_resume_gives_the_same_numbers(tiny_recipe,
                                                                                                tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**tiny_recipe, **RECIPE}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HEADPROBE_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(_cli(recipe, tmp_path / "reference"), env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    reference = json.loads((tmp_path / "reference" / "results.json").read_text())

    out = tmp_path / "stopped"
    job = subprocess.Popen(_cli(recipe, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True)
    try:
        while not _training_logged(out):  # no deadline: a loaded machine only makes this slower
            assert job.poll() is None, f"the run ended before the signal: {job.stderr.read()[-2000:]!r}"
            time.sleep(0.05)
        job.send_signal(signal.SIGTERM)  # what scancel and a SLURM time limit send
        _, err = job.communicate()
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "interrupted by SIGTERM" in err
    stopped = json.loads((out / "results.json").read_text())
    assert stopped["status"] == "interrupted" and stopped["error"]["stage"] == "training heads"
    assert "interrupted (SIGTERM)" in stopped["error"]["message"]
    steps = sorted(int(p.stem.split("-")[1]) for p in (out / "checkpoints").glob("step-*.pt"))
    total = reference["heads"]["relu"]["train"]["steps"]
    assert len(steps) == 1 and 2 <= steps[0] < total  # the steps done when the signal came, not lost
    assert stopped["invocations"][0]["status"] == "interrupted"
    extract_s = stopped["invocations"][0]["timing"]["extract_s"]

    done = subprocess.run(_cli(recipe, out, resume=True), env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = json.loads((out / "results.json").read_text())
    assert resumed["status"] == "complete"
    for name, tap in reference["taps"].items():
        assert resumed["taps"][name]["metrics"] == tap["metrics"], name
        assert resumed["taps"][name]["uncertainty"] == tap["uncertainty"], name
    assert resumed["buffer"] == reference["buffer"]
    first, second = resumed["invocations"]
    # The first invocation's extraction time is kept next to the resumed one's, each with how it ended.
    assert (first["status"], first["resume"], first["timing"]["extract_s"]) == ("interrupted", False, extract_s)
    assert (second["status"], second["resume"]) == ("complete", True)
    assert "train_s" in second["timing"] and "train_s" not in first["timing"]  # training finished in the second
    assert resumed["protocol"]["train"]["start_step"] == steps[0]  # training went on from the flushed step


def test_a_forked_child_that_inherited_the_handler_ends_as_the_default_would():
    with stop_signals():
        pid = os.fork()
        if pid == 0:  # the child: a DataLoader worker, say
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
            finally:
                os._exit(0)  # reached only if the signal did not end the child
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
