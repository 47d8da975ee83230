"""A scheduler's stop signals handled as Ctrl-C is: SIGTERM (what `scancel` and a SLURM time limit send) and SIGUSR1
(what `sbatch --signal=USR1@120` sends before the limit) raise `StopSignal`, a `KeyboardInterrupt`, so the stage
running is recorded "interrupted" in results.json and ``--resume`` continues from the finished work.

Only a signal whose handler is still the default (which would kill the process with no record) is taken over: a
handler the caller installed (submitit's, a test harness's) is left alone. A training step is never cut in half:
inside `atomic_step` a signal waits for the step's end (`engine` then writes a checkpoint of that step).

>>> import os, signal
>>> with stop_signals():
...     try:
...         os.kill(os.getpid(), signal.SIGTERM)
...     except StopSignal as stop:
...         print(stop, stop.exit_code)
SIGTERM 143
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["STOP_SIGNALS", "StopSignal", "atomic_step", "stop_signals"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopSignal(KeyboardInterrupt):
    """A stop signal received while a run runs; `exit_code` is 128 + the signal's number, as shells report it."""

    def __init__(self, signum: int) -> None:
        self.signum, self.name = signum, signal.Signals(signum).name
        self.exit_code = 128 + signum
        super().__init__(self.name)


class _Stops:
    """The handler's state while `stop_signals` is active: steps in progress, a signal waiting for their end."""

    def __init__(self) -> None:
        self.depth, self.pending, self.stopping = 0, None, False
        self.owner = os.getpid()

    def handle(self, signum: int, frame) -> None:
        if os.getpid() != self.owner:
            # A forked child (a DataLoader worker) inherited the handler: it ends as the signal's default would,
            # and the run's own process records the stop.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self.stopping:  # already stopping: the clean-up (recording, a checkpoint) is running
            return
        if self.depth:
            self.pending = signum
            return
        self.stopping = True
        raise StopSignal(signum)


_active: _Stops | None = None


@contextmanager
def stop_signals(signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """While inside, each of `signals` whose handler is the default raises `StopSignal` in the main thread (only
    there can Python handle signals; elsewhere this does nothing). The handlers are restored on the way out."""
    global _active
    if threading.current_thread() is not threading.main_thread() or _active is not None:
        yield
        return
    stops = _Stops()
    taken = {sig: signal.getsignal(sig) for sig in signals if signal.getsignal(sig) is signal.SIG_DFL}
    _active = stops
    for sig in taken:
        signal.signal(sig, stops.handle)
    try:
        yield
    finally:
        for sig, previous in taken.items():
            signal.signal(sig, previous)
        _active = None


@contextmanager
def atomic_step() -> Iterator[None]:
    """A unit of work a stop signal must not cut (one training step: every optimiser updated, or none). A signal
    that arrives inside is raised when the outermost step ends normally; an exception leaving the step wins."""
    stops = _active
    if stops is None:
        yield
        return
    stops.depth += 1
    try:
        yield
    finally:
        stops.depth -= 1
    if stops.depth == 0 and stops.pending is not None:
        signum, stops.pending, stops.stopping = stops.pending, None, True
        raise StopSignal(signum)
