"""A process group that headprobe started is destroyed when the interpreter exits (a gloo group left to
finalisation can abort a finished run with "terminate called without an active exception"); one the caller
started is left to the caller."""

import socket
import subprocess
import sys

import pytest
from timeouts import HANG_TIMEOUT_S

SCRIPT = """
import atexit, os, sys
import torch.distributed as dist
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=sys.argv[1], OMP_NUM_THREADS="1")
# Registered first, so it runs last (atexit is last in, first out): after headprobe's own clean-up.
atexit.register(lambda: print("at exit:", dist.is_initialized(), flush=True))
if sys.argv[2] == "caller":
    dist.init_process_group("gloo")
from headprobe.parallel.distributed import process_state
process_state()
print("started:", dist.is_initialized(), dist.get_backend(), flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("starter", "left_at_exit"), [("headprobe", False), ("caller", True)])
def test_a_process_group_headprobe_started_is_destroyed_at_exit(starter, left_at_exit):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(_free_port()), starter], capture_output=True,
                          text=True, timeout=HANG_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "started: True gloo" in done.stdout
    assert f"at exit: {left_at_exit}" in done.stdout
