"""The multi-process faults of #40 under `torchrun --nproc_per_node 2` (`headprobe.parallel.liveness`,
`pipeline.context.PeerStop`, `cli`): a process lost (SIGKILL), a Ctrl-C to the whole group, a frozen process
(SIGSTOP) found by heartbeats within HEADPROBE_PEER_TIMEOUT. In each, every process exits with the code one process
would, the run says one `error:` line across all processes, no process prints a traceback, and results.json records
the status. (torchrun itself always exits 1 with its own summary and traceback when a process failed; those are not
headprobe's and are not judged here.)"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from timeouts import HANG_TIMEOUT_S

from headprobe.parallel.liveness import frozen_sentence
from headprobe.parallel.peers import Peer
from headprobe.recipe.environment import DEFAULT_PEER_TIMEOUT_S, peer_timeout_s

TORCHRUN = Path(sys.executable).parent / "torchrun"
needs_torchrun = pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun missing")


def test_the_frozen_sentence_names_each_process_the_stage_and_the_setting():
    host = socket.gethostname()
    frozen = [Peer(1, host, 4242)]
    assert frozen_sentence(frozen, 2, "training heads", 3.0) == (
        f"process 1 of 2 (pid 4242 on {host}) stopped answering while training heads: no heartbeat for 3 s "
        "(HEADPROBE_PEER_TIMEOUT); it was stopped (SIGSTOP) or its host froze")
    two = frozen_sentence([Peer(1, "node-1", 7), Peer(2, "node-2", 8)], 3, "after extracting features", 300.0)
    assert two.startswith("process 1 of 3 (pid 7 on node-1), process 2 of 3 (pid 8 on node-2) stopped answering "
                          "after extracting features: no heartbeat for 300 s"), two


def test_the_peer_timeout_defaults_to_five_minutes_and_inf_turns_it_off():
    assert peer_timeout_s({}) == DEFAULT_PEER_TIMEOUT_S == 300.0
    assert peer_timeout_s({"HEADPROBE_PEER_TIMEOUT": " "}) == 300.0
    assert peer_timeout_s({"HEADPROBE_PEER_TIMEOUT": "3"}) == 3.0
    assert peer_timeout_s({"HEADPROBE_PEER_TIMEOUT": "inf"}) == float("inf")


# --- under torchrun -------------------------------------------------------------------------------------------

# `headprobe run` as the CLI runs it; each process writes its pid at the probe stage, then waits for signals/go, and
# writes the exit code it returns (torchrun prints no summary after a Ctrl-C).
SCRIPT = """
import os, pathlib, sys, time
import headprobe.pipeline.probing as probing
from headprobe.cli import main
signals = pathlib.Path(os.environ["TEST_SIGNALS"])
probe_heads = probing.probe_heads
def held(*args, **kwargs):
    (signals / f"pid-{os.environ['RANK']}").write_text(str(os.getpid()))
    while not (signals / "go").exists():
        time.sleep(0.05)
    return probe_heads(*args, **kwargs)
probing.probe_heads = held
code = main(sys.argv[1:])
(signals / f"exit-{os.environ['RANK']}").write_text(str(code))
sys.exit(code)
"""

# The smallest run that trains a head: a scratch ViT (no checkpoint to load), 101/37 digits, one epoch.
RECIPE = """name: tiny
backbone: {id: "scratch:vit-tiny", pooling: cls}
data: {source: sklearn-digits, limit: {train: 101, test: 37}}
features: {batch_size: 60}
heads: [{name: relu, width: 16}]
augment: {preset: crop-flip, views: 2}
train: {epochs: 1, batch_size: 32}
probes: {linear: {C_grid: [0.1, 1.0]}}
report: false
"""


class Job:
    """One `torchrun --nproc_per_node 2 SCRIPT run RECIPE --out run` in `folder`, each process's stderr in its own file
    (`--log-dir`, `--redirects 2`), started with `start` and held at the probe stage until `go`."""

    def __init__(self, folder: Path, cache: Path, **env: str) -> None:
        self.folder, self.out, self.signals, self.logs = folder, folder / "run", folder / "signals", folder / "logs"
        self.signals.mkdir()
        (folder / "job.py").write_text(SCRIPT)
        (folder / "recipe.yaml").write_text(RECIPE)
        self.argv = [str(TORCHRUN), "--nproc_per_node", "2", "--log-dir", str(self.logs), "--redirects", "2",
                     str(folder / "job.py"), "run", str(folder / "recipe.yaml"), "--out", str(self.out)]
        self.env = {**os.environ, "HEADPROBE_CACHE": str(cache), "OMP_NUM_THREADS": "1", "HEADPROBE_THREADS": "1",
                    "TEST_SIGNALS": str(self.signals), **env}
        self.proc: subprocess.Popen | None = None
        self.err = ""

    def start(self, new_group: bool = False) -> dict[int, int]:
        """Start the job and wait until both processes are at the probe stage: their pids by rank."""
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, start_new_session=new_group)
        deadline = time.monotonic() + HANG_TIMEOUT_S
        while not all((self.signals / f"pid-{rank}").exists() for rank in (0, 1)):
            assert self.proc.poll() is None, self.proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the run never reached the probe stage"
            time.sleep(0.1)
        time.sleep(0.3)  # both pid files are whole
        return {rank: int((self.signals / f"pid-{rank}").read_text()) for rank in (0, 1)}

    def go(self) -> None:
        (self.signals / "go").touch()

    def wait(self) -> None:
        _, self.err = self.proc.communicate(timeout=HANG_TIMEOUT_S)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()

    def results(self) -> dict:
        return json.loads((self.out / "results.json").read_text())

    def rank_stderr(self) -> str:
        """Every process's stderr, one after the other (torchrun's own is `err`)."""
        files = sorted(self.logs.rglob("stderr.log"))
        assert len(files) == 2, files
        return "".join(f.read_text() for f in files)

    def exit_codes(self) -> dict[int, int]:
        """Each failed process's exit code by rank: the code `main` returned, else (a process killed, or ended by
        `os._exit`) torchrun's summary, where a signal is its negative number. A process that exited 0 is in none."""
        found = re.findall(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*exitcode\s*:\s*(-?\d+)", self.err)
        codes = {int(rank): int(code) for rank, code in found}
        returned = {rank: int((self.signals / f"exit-{rank}").read_text()) for rank in (0, 1)
                    if (self.signals / f"exit-{rank}").exists()}
        assert all(codes.get(rank, code) == code for rank, code in returned.items()), (codes, returned)
        return {rank: code for rank, code in {**codes, **returned}.items() if code != 0}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One feature cache for the cases: the backbone's features are extracted once."""
    return tmp_path_factory.mktemp("cache")


def _one_error_no_traceback(job: Job) -> str:
    """The one `error:` line the processes printed between them (asserting there is exactly one, and no traceback)."""
    err = job.rank_stderr()
    assert "Traceback" not in err, err[-3000:]
    said = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(said) == 1, (said, err[-3000:], job.err[-2000:])
    return said[0]


@pytest.mark.slow
@pytest.mark.distributed
@needs_torchrun
@pytest.mark.parametrize("killed", [1, 0])
def test_a_killed_process_is_said_once_as_lost_and_the_other_exits_1(tmp_path, cache, killed):
    job = Job(tmp_path, cache)
    try:
        pids = job.start()
        os.kill(pids[killed], signal.SIGKILL)
        job.wait()
    finally:
        job.kill()
    left = 1 - killed
    assert job.exit_codes() == {killed: -signal.SIGKILL, left: 1}, job.err[-3000:]
    line = _one_error_no_traceback(job)
    assert line.startswith(f"error: process {killed} of 2 (pid {pids[killed]} on {socket.gethostname()}) was lost "
                           "after training heads"), line
    results = job.results()
    assert results["status"] == "failed" and f"error: {results['error']['message']}" == line


@pytest.mark.slow
@pytest.mark.distributed
@needs_torchrun
def test_ctrl_c_to_the_group_is_said_once_and_every_process_exits_130(tmp_path, cache):
    job = Job(tmp_path, cache)
    try:
        job.start(new_group=True)
        os.killpg(job.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: every process of the group
        job.wait()
    finally:
        job.kill()
    assert job.exit_codes() == {0: 130, 1: 130}, job.err[-3000:]
    line = _one_error_no_traceback(job)
    expected = 'error: interrupted; the run directory keeps every finished stage (status "interrupted")'
    assert line.startswith(expected), line
    assert job.results()["status"] == "interrupted"


@pytest.mark.slow
@pytest.mark.distributed
@needs_torchrun
@pytest.mark.parametrize("stopped", [1, 0])
def test_a_frozen_process_fails_the_run_within_the_peer_timeout(tmp_path, cache, stopped):
    """SIGSTOP on one process at the probe stage, HEADPROBE_PEER_TIMEOUT=3: the other finds it by its heartbeats (or,
    with process 0 frozen, by the store that no longer answers), records "failed" naming it, says so once and exits 1
    well before the 2-hour collective timeout."""
    timeout_s = 3
    job = Job(tmp_path, cache, HEADPROBE_PEER_TIMEOUT=str(timeout_s))
    pids = {}
    try:
        pids = job.start()
        os.kill(pids[stopped], signal.SIGSTOP)
        frozen_at = time.monotonic()
        job.go()  # the other process goes on to the probes' first exchange and waits there
        while job.results()["status"] == "running":
            assert time.monotonic() - frozen_at < timeout_s + 20, "the frozen process was not found in time"
            time.sleep(0.2)
        found_s = time.monotonic() - frozen_at
    finally:
        if pids:
            os.kill(pids[stopped], signal.SIGKILL)
        job.wait()
        job.kill()
    left = 1 - stopped
    assert job.exit_codes() == {stopped: -signal.SIGKILL, left: 1}, job.err[-3000:]
    line = _one_error_no_traceback(job)
    expected = (f"error: process {stopped} of 2 (pid {pids[stopped]} on {socket.gethostname()}) stopped answering "
                f"while training heads: no heartbeat for {timeout_s} s (HEADPROBE_PEER_TIMEOUT)")
    assert line.startswith(expected), line
    results = job.results()
    assert results["status"] == "failed" and f"error: {results['error']['message']}" == line, found_s
    assert results["environment"]["peer_timeout_s"] == timeout_s
