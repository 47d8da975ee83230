"""The processes of a multi-process run, and which of them were lost when the run stops.

At the start every process tells the others its host and pid (`exchange_peers`, one collective). When the run
stops (a collective fails because a peer died, or the launcher stops this process after one died: torchrun sends
SIGTERM to the survivors), `lost_peers` names the processes on this host that no longer run (a killed process not yet
reaped by its launcher, a zombie, counts as gone). A process on another host cannot be checked this way; the stop is
then recorded as it came.

>>> peers = exchange_peers(state)  # doctest: +SKIP
>>> lost_sentence(lost_peers(peers, state.process_index), 2, "running probe 'linear' on tap 'relu'")  # doctest: +SKIP
"process 1 of 2 (pid 4242 on node-1) was lost while running probe 'linear' on tap 'relu'"
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LOST_WAIT_S", "Peer", "exchange_peers", "lost_peers", "lost_sentence", "process_runs", "timed_out",
           "timeout_sentence"]

# How long a stopping process looks for a lost peer: a peer killed a moment ago may still be exiting.
LOST_WAIT_S = 3.0


@dataclass(frozen=True)
class Peer:
    """One process of the run: its rank, host name and pid."""

    rank: int
    host: str
    pid: int


def process_runs(pid: int) -> bool:
    """Whether process `pid` runs on this host (a zombie, dead and not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rpartition(")")[2].split()[0] != "Z"
    return True


def exchange_peers(state) -> list[Peer]:
    """Every process's (rank, host, pid), on every process; [] with one process (no collective)."""
    from headprobe.parallel.collectives import all_objects

    if state.num_processes == 1:
        return []
    mine = (socket.gethostname(), os.getpid())
    return [Peer(rank, host, pid) for rank, (host, pid) in enumerate(all_objects(mine, state.num_processes))]


def lost_peers(peers: list[Peer], rank: int, wait_s: float = LOST_WAIT_S) -> list[Peer]:
    """The other processes on this host that no longer run, looked for during up to `wait_s` seconds (none lost
    with one process, or when none is found by then)."""
    host = socket.gethostname()
    local = [p for p in peers if p.rank != rank and p.host == host]
    deadline = time.monotonic() + wait_s
    while True:
        lost = [p for p in local if not process_runs(p.pid)]
        if lost or not local or time.monotonic() >= deadline:
            return lost
        time.sleep(0.1)


def lost_sentence(lost: list[Peer], world: int, stage: str) -> str:
    """"process 1 of 2 (pid 4242 on node-1) was lost while <stage>", for every lost process."""
    which = ", ".join(f"process {p.rank} of {world} (pid {p.pid} on {p.host})" for p in lost)
    when = stage if stage.startswith("after ") else f"while {stage}"
    return f"{which} {'was' if len(lost) == 1 else 'were'} lost {when}"


def timed_out(message: str) -> bool:
    """Whether a stop's message is a collective that waited past its timeout (gloo: "Timed out waiting ...ms",
    NCCL's watchdog: "... timed out")."""
    return "timed out" in message.lower()


def timeout_sentence(world: int, stage: str) -> str:
    """Why a run whose collective timed out stopped: no process was lost, one did not answer in time."""
    from headprobe.parallel.distributed import collective_timeout_s

    when = stage if stage.startswith("after ") else f"while {stage}"
    return (f"a process of {world} did not answer within {collective_timeout_s():.0f} s (HEADPROBE_COLLECTIVE_TIMEOUT) "
            f"{when}: it was stopped (SIGSTOP, a hung device) or fell that far behind")
