"""A tracker that does not answer never hangs a run (#40): every call waits at most `runtime.tracker_timeout_s`
(`parallel.bounded.BoundedWorker`), and a tracker that fails or times out after the run started is dropped with one
warning line while the run finishes with its results on disk. The server is only ever a loopback address."""

import json
import socket
import subprocess
import sys
import threading
import time
import warnings

import pytest
import yaml
from timeouts import HANG_TIMEOUT_S

from headprobe.parallel.bounded import BoundedWorker
from headprobe.recipe import RecipeError, load_recipe
from headprobe.report.trackers import Trackers


def test_a_bounded_worker_runs_calls_in_order_on_one_thread_and_hands_back_errors():
    worker = BoundedWorker(timeout_s=10.0)
    threads = [worker.call(lambda: threading.get_ident(), "who") for _ in range(3)]
    assert len(set(threads)) == 1 and threads[0] != threading.get_ident()
    with pytest.raises(ZeroDivisionError):
        worker.call(lambda: 1 / 0, "divide")
    assert worker.call(lambda: "still serving", "after") == "still serving"
    worker.stop()


def test_a_call_that_does_not_answer_times_out_within_its_bound_and_stops_the_worker():
    gate = threading.Event()
    worker = BoundedWorker(timeout_s=0.3)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="connecting got no answer within 0.3 s"):
        worker.call(gate.wait, "connecting")
    assert 0.3 <= time.monotonic() - start < 5.0
    with pytest.raises(TimeoutError, match="connecting got no answer, so logging was not sent"):
        worker.call(lambda: 1, "logging")
    gate.set()


def test_a_worker_stuck_forever_does_not_keep_the_process_from_exiting():
    code = ("import threading; from headprobe.parallel.bounded import BoundedWorker\n"
            "w = BoundedWorker(0.2)\n"
            "try:\n    w.call(threading.Event().wait, 'x')\nexcept TimeoutError:\n    print('timed out')\n")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    assert done.returncode == 0 and done.stdout.strip() == "timed out", done.stderr[-2000:]
    assert time.monotonic() - start < 60


class _Fake:
    """An Accelerate tracker whose calls hang (`hang` names them) or raise (`fail`), and that keeps what it got."""

    def __init__(self, name, hang=(), fail=()):
        self.name, self.hang, self.fail, self.got = name, hang, fail, []
        self.gate = threading.Event()

    def _do(self, what, value):
        if what in self.hang:
            self.gate.wait()
        if what in self.fail:
            raise ConnectionRefusedError(f"[Errno 111] Connection refused\nretry {what}")
        self.got.append((what, value))

    def log(self, values, step):
        self._do("log", (dict(values), step))

    def finish(self):
        self._do("finish", None)


RECORD = {"stage": "train", "head": "mlp", "step": 3, "loss": 0.5}


def test_a_tracker_that_hangs_is_dropped_with_one_warning_and_the_others_go_on():
    stuck, good = _Fake("mlflow", hang=("log",)), _Fake("tensorboard")
    trackers = Trackers([stuck, good], timeout_s=0.3)
    start = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            trackers.log_record(RECORD | {"step": step})
        trackers.log_results({"taps": {"backbone": {"metrics": {"knn.k5.acc": 0.9}}}})
        trackers.close()
    assert time.monotonic() - start < 5.0  # one bound, not one per call
    assert [str(w.message) for w in caught] == [
        "report_to: mlflow failed while logging a training curve (TimeoutError: logging a training curve got no "
        "answer within 0.3 s); nothing more is sent to it, and the run goes on (its results are on disk as always)."]
    assert [what for what, _ in good.got] == ["log", "log", "log", "log", "finish"]
    assert good.got[3][1] == ({"taps/backbone/knn.k5.acc": 0.9}, 2)
    assert trackers.trackers == []
    stuck.gate.set()


def test_a_tracker_failing_at_the_end_gives_its_error_s_first_line():
    failing = _Fake("wandb", fail=("finish",))
    trackers = Trackers([failing], timeout_s=5.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trackers.log_record(RECORD)
        trackers.close()
    assert [str(w.message) for w in caught] == [
        "report_to: wandb failed while finishing the run (ConnectionRefusedError: [Errno 111] Connection refused); "
        "nothing more is sent to it, and the run goes on (its results are on disk as always)."]


def test_the_bound_is_a_recipe_value_checked_and_recorded_with_the_recipe():
    assert load_recipe({}).runtime.tracker_timeout_s == 30.0
    assert load_recipe({"runtime": {"tracker_timeout_s": 2}}).to_dict()["runtime"]["tracker_timeout_s"] == 2.0
    for bad in (0, -1, 1e11):
        with pytest.raises(RecipeError, match=r"runtime.tracker_timeout_s = .* is out of range; it must be in \(0, "):
            load_recipe({"runtime": {"tracker_timeout_s": bad}})


def _silent_loopback_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_an_mlflow_server_that_does_not_answer_leaves_the_run_complete(tmp_path):
    pytest.importorskip("mlflow")
    pytest.importorskip("accelerate")
    recipe = {"name": "tiny", "backbone": {"id": "scratch:vit-tiny", "pooling": "cls"},
              "data": {"source": "sklearn-digits", "limit": {"train": 80, "test": 40}}, "features": {"batch_size": 40},
              "probes": {"knn": {"ks": [5]}}, "report": False, "report_to": ["mlflow"],
              "runtime": {"tracker_timeout_s": 2}}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    env = {**__import__("os").environ, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{_silent_loopback_port()}",
           "HEADPROBE_CACHE": str(tmp_path / "cache")}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "headprobe", "run", str(tmp_path / "recipe.yaml"), "--out",
                           str(tmp_path / "run")], env=env, capture_output=True, text=True, timeout=HANG_TIMEOUT_S,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - start < 120
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if "report_to: mlflow" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: report_to: mlflow failed while starting the run ("), \
        done.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["status"] == "complete" and results["recipe"]["runtime"]["tracker_timeout_s"] == 2.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "recipe.yaml", "run"]  # no mlruns/, mlflow.db
