"""Whether the other processes of a run still make progress, and how each one ended.

A process stopped by SIGSTOP (or on a host that stopped scheduling it) never fails a collective: the others would
wait for it for the whole collective timeout (`distributed.collective_timeout_s`, 2 h, room for one process's long
stage). So every process beats: a thread adds 1 to its own count in a `torch.distributed.TCPStore` that the main
process serves (as `counter.SharedCounter` does) and reads the others' counts, every `timeout_s / 5` seconds. A
process's threads run while its main thread computes alone or waits in a collective, so a slow process keeps
beating; a stopped one does not. A count that has not moved for `timeout_s` seconds (`HEADPROBE_PEER_TIMEOUT`), or a
store that has not answered for that long (the main process, which serves it, is frozen), calls `on_frozen` with the
frozen peers, in the watching thread.

A process that ends tells the others how (`end`, read back with `ended`): its count then stops without it being
frozen, and a peer that stopped on the same Ctrl-C is not taken as lost (`peers.lost_peers` judges only the pid). A
process that died (its pid gone) is not frozen either: `peers` records it.

>>> watch = PeerWatch([], rank=0, timeout_s=300.0, on_frozen=print)  # one process: nothing to watch
>>> watch.start(); watch.end("complete"); watch.ended(1) is None
True
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable

from headprobe.parallel.collectives import all_objects
from headprobe.parallel.counter import shared_store
from headprobe.parallel.peers import Peer, process_runs

__all__ = ["PeerWatch", "frozen_sentence"]

# How many heartbeats fit in one timeout: a peer is frozen after missing about this many.
BEATS_PER_TIMEOUT = 5
# The longest one store call may wait (a timeout above it is still judged on the counts).
MAX_STORE_WAIT_S = 3600.0


class PeerWatch:
    """The heartbeats of `peers` (`peers.exchange_peers`; [] with one process) seen from process `rank`. Every
    process must construct it at the same point (it exchanges the store's port once), then `start` it; `end` stops
    it.

    A store call to a frozen main process never returns (its socket stays open), so on the other processes a guard
    thread times every call in flight: one that has waited `timeout_s` means the main process is frozen."""

    def __init__(self, peers: list[Peer], rank: int, timeout_s: float,
                 on_frozen: Callable[[list[Peer]], None]) -> None:
        self.peers, self.rank, self.timeout_s, self.on_frozen = peers, rank, timeout_s, on_frozen
        self.store = None
        self.store_wait_s = min(timeout_s, MAX_STORE_WAIT_S)
        self._stop, self._closed = threading.Event(), threading.Event()
        self._lock = threading.Lock()
        self._asked: dict[int, float] = {}  # the store calls in flight: their thread → when each was made
        self._fired = self._main_gone = False
        self._threads: list[threading.Thread] = []
        if len(peers) > 1:
            # Every process watches, or none does: one left without the store would never beat, and look frozen.
            store = shared_store(rank, len(peers), self.store_wait_s)
            if all(all_objects(store is not None, len(peers))):
                self.store = store

    def start(self) -> None:
        """Beat and watch in daemon threads (nothing with one process, no store, or an infinite timeout)."""
        if self.store is None or math.isinf(self.timeout_s):
            return
        self._threads = [threading.Thread(target=self._watch, name="headprobe-peer-heartbeat", daemon=True)]
        if self.rank != 0:
            self._threads.append(threading.Thread(target=self._guard, name="headprobe-peer-guard", daemon=True))
        for thread in self._threads:
            thread.start()

    def end(self, status: str, stage: str = "", message: str = "") -> None:
        """This process stops: stop beating and tell the others how (its `status`, "complete", "interrupted" or
        "failed", at `stage` with `message`). Only the first call counts."""
        if self._stop.is_set():
            return
        self._stop.set()
        beat = self._threads[0] if self._threads else None
        if beat is not None and beat is not threading.current_thread() and not self._main_gone:
            beat.join(self.store_wait_s)  # its store call in flight ends before the others may leave
        try:
            self._call(self.store.set, f"end-{self.rank}",
                       json.dumps({"status": status, "stage": stage, "message": message}))
        except (RuntimeError, OSError, AttributeError):  # no store, or the main process is gone: nobody to tell
            pass
        self._closed.set()

    def ended(self, rank: int) -> dict | None:
        """How process `rank` said it ended ({"status", "stage", "message"}), or None: still running, died without
        saying, or no store."""
        if rank == self.rank:
            return None
        try:
            if self._call(self.store.check, [f"end-{rank}"]):
                return json.loads(self._call(self.store.get, f"end-{rank}"))
        except (RuntimeError, OSError, ValueError, AttributeError):
            pass
        return None

    def linger(self, wait_s: float) -> None:
        """On the main process, which serves the store: wait up to `wait_s` seconds until every other process has
        ended or is gone, so that none of them finds the store gone before it could read how this one ended."""
        if self.store is None or self.rank != 0:
            return
        deadline = time.monotonic() + wait_s
        others = [p for p in self.peers if p.rank != self.rank]
        while time.monotonic() < deadline:
            try:
                if all(self.store.check([f"end-{p.rank}"]) or not process_alive(p) for p in others):
                    return
            except (RuntimeError, OSError):
                return
            time.sleep(0.05)

    def _call(self, fn, *args):
        """fn(*args) on the store, timed for the guard; OSError without calling when the store cannot answer: none,
        or its main process was seen gone or frozen (a call to a store whose server is gone makes torch log a C++
        stack trace, one to a frozen server never returns)."""
        if self.store is None or self._main_gone or (self.rank != 0 and not process_alive(self.peers[0])):
            self._main_gone = self.store is not None
            raise OSError("the store is gone")
        me = threading.get_ident()
        with self._lock:
            self._asked[me] = time.monotonic()
        try:
            return fn(*args)
        finally:
            with self._lock:
                self._asked.pop(me, None)

    def _watch(self) -> None:
        others = [p for p in self.peers if p.rank != self.rank]
        seen = {p.rank: (-1, time.monotonic()) for p in others}  # (last count, when it last moved)
        while not self._stop.wait(self.timeout_s / BEATS_PER_TIMEOUT):
            try:
                self._call(self.store.add, f"beat-{self.rank}", 1)
                counts = {p.rank: int(self._call(self.store.add, f"beat-{p.rank}", 0)) for p in others}
                ended = {p.rank for p in others if self._call(self.store.check, [f"end-{p.rank}"])}
            except (RuntimeError, OSError):
                return  # the main process ended or died (`peers` records a death)
            now, frozen = time.monotonic(), []
            for peer in others:
                if peer.rank in ended:
                    continue
                last, moved = seen[peer.rank]
                if counts[peer.rank] != last:
                    seen[peer.rank] = (counts[peer.rank], now)
                elif now - moved >= self.timeout_s and process_alive(peer):
                    frozen.append(peer)
            if frozen:
                self._frozen(frozen)
                return

    def _guard(self) -> None:
        main = self.peers[0]
        while not self._closed.wait(self.timeout_s / BEATS_PER_TIMEOUT):
            with self._lock:
                oldest = min(self._asked.values(), default=None)
            if oldest is not None and time.monotonic() - oldest >= self.timeout_s and process_alive(main):
                self._main_gone = True  # no more calls to it: they would never return
                self._frozen([main])
                return

    def _frozen(self, frozen: list[Peer]) -> None:
        with self._lock:
            if self._fired or self._closed.is_set():
                return
            self._fired = True
        self.on_frozen(frozen)


def process_alive(peer: Peer) -> bool:
    """Whether `peer` may still run: its pid runs on this host, or it is on another host (not checkable here)."""
    import socket

    return peer.host != socket.gethostname() or process_runs(peer.pid)


def frozen_sentence(frozen: list[Peer], world: int, stage: str, timeout_s: float) -> str:
    """"process 1 of 2 (pid 4242 on node-1) stopped answering while <stage>: ...", naming every frozen process."""
    which = ", ".join(f"process {p.rank} of {world} (pid {p.pid} on {p.host})" for p in frozen)
    when = stage if stage.startswith("after ") else f"while {stage}"
    return (f"{which} stopped answering {when}: no heartbeat for {timeout_s:.0f} s (HEADPROBE_PEER_TIMEOUT); it was "
            "stopped (SIGSTOP) or its host froze")
