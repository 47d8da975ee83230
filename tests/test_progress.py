"""Progress in log files: plain lines at a steady interval when the output is not a terminal (`report.progress`),
for extraction, training, probing and the geometry (with its size said first)."""

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from headprobe.report.progress import LineProgress, progress_interval


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_lines_come_at_the_interval_and_when_a_task_completes():
    out, clock = io.StringIO(), Clock()
    progress = LineProgress(out, interval=10.0, clock=clock)
    task = progress.add_task("extract train", total=100, completed=20)  # resumed at 20
    for _ in range(80):
        clock.now += 1.0
        progress.advance(task)
    lines = out.getvalue().splitlines()
    # A line at the first step, then every 10 s, then the last: 21 after 1 s, 31 after 11 s, ... 91, and 100.
    assert [int(re.search(r": (\d+)/100", line).group(1)) for line in lines] == [21, 31, 41, 51, 61, 71, 81, 91, 100]
    assert lines[0] == "[progress] extract train: 21/100 (21%), 1/s, ~1 min 19 s left"  # rate counts this run only
    assert lines[-1] == "[progress] extract train: 100/100 (100%), 1/s, done in 1 min 20 s"


def test_a_task_without_a_total_reports_its_count_and_rate():
    out, clock = io.StringIO(), Clock()
    progress = LineProgress(out, interval=0, clock=clock)
    task = progress.add_task("views", total=None)
    clock.now = 4.0
    progress.advance(task, 10)
    assert out.getvalue() == "[progress] views: 10, 2.5/s\n"


@pytest.mark.parametrize("text", ["soon", "-1"])
def test_a_bad_interval_is_refused_with_the_fix(text):
    with pytest.raises(ValueError, match="HEADPROBE_PROGRESS_INTERVAL=.* is not a number of seconds >= 0"):
        progress_interval({"HEADPROBE_PROGRESS_INTERVAL": text})
    assert progress_interval({}) == 30.0 and progress_interval({"HEADPROBE_PROGRESS_INTERVAL": "0"}) == 0.0


def _partial(lines: list[str], label: str) -> list[tuple[int, int]]:
    """(done, total) of the progress lines of `label` written before its task completed."""
    found = [tuple(map(int, m.groups())) for line in lines
             if (m := re.match(rf"\[progress\] {re.escape(label)}: (\d+)/(\d+) ", line))]
    return [(done, total) for done, total in found if done < total]


@pytest.mark.slow
def test_a_run_piped_to_a_file_prints_progress_lines_during_every_stage(tiny_recipe, tmp_path):
    recipe = {**tiny_recipe, "heads": [{"name": "mlp", "width": 16, "out_dim": 8}], "objective": {"name": "vicreg"},
              "augment": {"preset": "crop-flip", "views": 2},
              "train": {"epochs": 2, "batch_size": 50, "log_every": 4}, "geometry": {"rows": 16}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    env = {**os.environ, "HEADPROBE_PROGRESS_INTERVAL": "0", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "headprobe", "run", str(path), "--out", str(tmp_path / "run")],
                         env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stderr.splitlines()
    # Interval 0: a line at every batch, so each stage has lines written before it ended, not only its last one.
    assert _partial(lines, "extract train") and _partial(lines, "extract test")
    assert _partial(lines, "train 1 heads") == [(s, 8) for s in range(1, 8)]  # 2 epochs × 4 batches of 50
    assert _partial(lines, "probing 1 tap")  # the backbone's 2 probes: a line after the first
    assert _partial(lines, "probing 2 taps")  # the head's two layers
    # No rich bar drawn into the log (a bar, then its count: "━━━━ 8/8").
    assert not any(re.search(r"━ *\d+/\d+", line) for line in lines + run.stdout.splitlines())

    geometry = subprocess.run([sys.executable, "-m", "headprobe", "geometry", str(tmp_path / "run")], env=env,
                              capture_output=True, text=True)
    assert geometry.returncode == 0, geometry.stderr[-3000:]
    lines = geometry.stderr.splitlines()
    size = next(i for i, line in enumerate(lines) if line.startswith("geometry of head 'mlp': 16 rows of 32 → 8"))
    parts = [i for i, line in enumerate(lines) if line.startswith("[progress] geometry of head 'mlp': ")]
    assert len(parts) == 5 and size < parts[0]  # the size is said before the work starts
    assert "MiB" in lines[size] and "Hessian-vector products" in lines[size]
    assert json.loads((tmp_path / "run" / "results.json").read_text())["heads"]["mlp"]["geometry"]["curvature"]


def test_a_followed_count_shows_what_other_processes_add_while_it_waits():
    """`FollowedCount` (the main process of a shared stage): each count it reads becomes the task's done, checked on
    its own thread, so lines come while the main thread is blocked; a count it cannot read stops the following."""
    import threading

    from headprobe.report.progress import FollowedCount

    out, clock, counts, read_again = io.StringIO(), Clock(), [0], threading.Event()

    def read():
        read_again.set()
        return counts[0]

    progress = LineProgress(out, interval=0.0, clock=clock)
    task = progress.add_task("probing 3 taps", total=6)
    with FollowedCount(progress, task, total=6, read=read, poll=0.01):
        for done in (2, 5):  # the other processes' probes, added while this thread waits
            counts[0] = done
            read_again.clear()
            read_again.wait()
            read_again.clear()
            read_again.wait()  # read at least once after the change
        counts[0] = 6
    shown = [int(re.search(r": (\d+)/6", line).group(1)) for line in out.getvalue().splitlines()]
    assert shown == [2, 5, 6]
    gone = LineProgress(io.StringIO(), interval=0.0, clock=clock)
    task = gone.add_task("probing", total=4)
    with FollowedCount(gone, task, total=4, read=lambda: None, poll=0.01):
        pass
    assert gone.tasks[task].done == 0  # the count could not be read: nothing claimed done


# Process 1 takes 2 s more after each of its probes: the main process (0) has long finished its own share and
# waits in the exchange while process 1's probes come in.
SHARED = """
import json, os, sys, time
import headprobe.pipeline.probe_sharing as probe_sharing
from headprobe import run
if os.environ.get("RANK") == "1":  # process 1's probes finish late: the name the shared probe stage calls
    run_probes = probe_sharing.run_probes
    def slow(*args, **kwargs):
        for item in run_probes(*args, **kwargs):
            time.sleep(2.0)
            yield item
    probe_sharing.run_probes = slow
run(json.loads(sys.argv[1]), out=sys.argv[2])
"""


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="torchrun missing")
def test_the_main_process_shows_the_probes_of_every_process_in_a_log(tiny_recipe, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SHARED)
    recipe = {**tiny_recipe, "heads": [{"name": "relu", "width": 16}], "augment": {"preset": "crop-flip", "views": 2},
              "train": {"epochs": 1, "batch_size": 50},
              "probes": {"linear": {"C_grid": [0.1, 1.0]}, "knn": {"ks": [5]}, "spectrum": {}}}
    torchrun = str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "HEADPROBE_PROGRESS_INTERVAL": "0", "OMP_NUM_THREADS": "1",
           "HEADPROBE_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([torchrun, "--nproc_per_node", "2", str(script), json.dumps(recipe), str(tmp_path / "run")],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    ran = [r["process"] for r in logged if r.get("stage") == "probe"]
    assert len(ran) == 9 and ran.count(1) >= 2  # 3 probes × (backbone, relu@1, relu), shared out
    # One probing stage (the backbone tap with the head taps), shown once, by the main process: done/total over
    # both processes, each count a line (interval 0), rising to 9/9.
    lines = [line for line in done.stderr.splitlines() if line.startswith("[progress] probing ")]
    counts = [int(re.search(r": (\d+)/9 ", line).group(1)) for line in lines]
    assert lines[0].startswith("[progress] probing 3 taps: ") and counts == sorted(set(counts)) and counts[-1] == 9
    # Counts beyond what the main process ran itself, shown before the end: process 1's probes, as they finished.
    assert [c for c in counts if ran.count(0) < c < 9]
    assert not [line for line in done.stderr.splitlines() if re.search(r"━ *\d+/\d+", line)]
