"""Calls into an outside service (an experiment tracker's server), each waited for at most a bound: a
`BoundedWorker` runs them one after another on a thread of its own and gives each call's result or exception, or a
`TimeoutError` once the bound has passed.

Every call of one worker runs on the same thread, in order: MLflow keeps its active run per thread. A call that does
not answer keeps its (daemon) thread, which no exit waits for; the worker then takes no further calls.

>>> worker = BoundedWorker(timeout_s=5.0)
>>> worker.call(lambda: 6 * 7, "the answer")
42
>>> worker.stop()
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class _Pending(threading.Event):
    """One call's outcome, set by the worker's thread."""

    value: Any = None
    error: BaseException | None = None


class BoundedWorker:
    """A thread that runs calls in order, each waited for at most `timeout_s` seconds by its caller."""

    def __init__(self, timeout_s: float, name: str = "headprobe-bounded") -> None:
        self.timeout_s = timeout_s
        self.stuck: str | None = None  # the call that did not answer in time: no further call is taken
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            call, pending = self._jobs.get()
            if call is None:
                return
            try:
                pending.value = call()
            except BaseException as err:  # handed to the caller, which raises it in its own thread
                pending.error = err
            pending.set()

    def call(self, fn: Callable[[], Any], what: str) -> Any:
        """fn()'s result (or its exception), run on the worker's thread; `TimeoutError` naming `what` when it takes
        longer than the bound, or when an earlier call never answered."""
        if self.stuck is not None:
            raise TimeoutError(f"{self.stuck} got no answer, so {what} was not sent")
        pending = _Pending()
        self._jobs.put((fn, pending))
        if not pending.wait(self.timeout_s):
            self.stuck = what
            raise TimeoutError(f"{what} got no answer within {self.timeout_s:g} s")
        if pending.error is not None:
            raise pending.error
        return pending.value

    def stop(self) -> None:
        """Let the thread end once the calls before have run (at once where none is waiting)."""
        self._jobs.put((None, None))
