"""A count that every process of a run adds to and the main process reads at any moment, without waiting for the
others: how the main process shows the progress of work shared among processes (`pipeline.probe_sharing`).

The collectives (`collectives.all_objects`) meet only when every process arrives; progress must be read while the
others are still working. So the main process serves a `torch.distributed.TCPStore` (its port chosen by the system
and told to the others once, in the one collective here) whose atomic `add` each process calls as it finishes a
piece of work. The count is only shown: when the store cannot be reached (the main process is gone) the count stops
and nothing else changes; losing a process is recorded by the run (`parallel.peers`).
"""

from __future__ import annotations

import datetime
import os

import torch.distributed as dist

from headprobe.parallel.collectives import all_objects

__all__ = ["SharedCounter", "shared_store"]

# How long a process waits for the store (connecting, one add): progress must never hold a run up for long.
STORE_TIMEOUT_S = 30.0


class SharedCounter:
    """Counts by name over `world` processes; `rank` 0 serves them. Every process must construct it at the same
    point (it exchanges the port once).

    >>> counter = SharedCounter(rank=0, world=1)
    >>> counter.add("probes-0", 2), counter.add("probes-0", 1), counter.read("probes-0")
    (2, 3, 3)
    """

    def __init__(self, rank: int, world: int) -> None:
        self.store = shared_store(rank, world, STORE_TIMEOUT_S)

    def add(self, name: str, amount: int) -> int | None:
        """Add `amount` to count `name`; its new value, or None where the store cannot be reached."""
        if self.store is None:
            return None
        try:
            return int(self.store.add(name, amount))
        except (RuntimeError, OSError):  # the main process is gone: the run records that, not the count
            self.store = None
            return None

    def read(self, name: str) -> int | None:
        """Count `name` now (0 before any add), or None where the store cannot be reached."""
        return self.add(name, 0)


def shared_store(rank: int, world: int, timeout_s: float) -> dist.TCPStore | None:
    """A TCPStore that process 0 serves on a port the system chooses, told to the others in one collective (every
    process calls this at the same point); None where it cannot be served or reached. A call to it waits at most
    `timeout_s` seconds."""
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    timeout = datetime.timedelta(seconds=timeout_s)
    store, port = None, None
    if rank == 0:
        try:
            store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timeout)
            port = store.port
        except (RuntimeError, OSError):  # no port to serve on: the others get none either
            store = None
    port = all_objects(port, world)[0]
    if rank != 0 and port is not None:
        try:
            store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
        except (RuntimeError, OSError):
            store = None
    return store
