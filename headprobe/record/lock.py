"""The run-folder lock: one headprobe command at a time writes into a run folder.

`headprobe run` (and `--resume`), `headprobe geometry` and `headprobe report` hold ``RUN/headprobe.lock`` while they
write there; a second command finds it and stops at once (exit 2) with a sentence naming the holder. The lock is a
file made by exclusive create (``O_CREAT | O_EXCL``, atomic on local and NFS file systems, unlike ``flock`` on many
NFS set-ups) holding who made it (pid, host, start time); a thread touches it every `HEARTBEAT_S` seconds while it is
held. A lock whose holder is gone is taken over with a warning: on this host, when its pid no longer runs; made on
another host (a shared file system), when its heartbeat is older than `stale_after_s` (`HEADPROBE_LOCK_TIMEOUT`), or
dated that far in the future (clocks apart); a lock file without a readable holder (not JSON, a pid that is no
process id: negative, ``true``, too large), when untouched for `GARBAGE_AFTER_S`. A folder where the lock file should
be is refused with a sentence.
Only the main process of a multi-process run holds it.

>>> with RunLock(run_dir, "run"):  # doctest: +SKIP
...     ...  # write into run_dir
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import warnings
from pathlib import Path

from ..parallel.peers import process_runs
from ..recipe import RecipeError
from ..recipe.environment import DEFAULT_LOCK_TIMEOUT_S, lock_timeout_s

__all__ = ["HEARTBEAT_S", "LOCK_NAME", "RunFolderLocked", "RunLock", "folder_lock", "stale_after_s"]

LOCK_NAME = "headprobe.lock"
HEARTBEAT_S = 10.0
STALE_AFTER_S = DEFAULT_LOCK_TIMEOUT_S  # a foreign host's lock untouched this long was left by a dead process
GARBAGE_AFTER_S = 5.0  # a lock without a readable holder untouched this long was left by a maker that died writing it
PID_MAX = 2**31 - 1  # the largest pid `os.kill` takes (Linux's own limit is 2**22)


class RunFolderLocked(RecipeError):
    """Another headprobe command holds the run folder (exit 2: nothing was written)."""


def stale_after_s() -> float:
    """Seconds without a heartbeat after which another host's lock is stale: `HEADPROBE_LOCK_TIMEOUT`, else
    `STALE_AFTER_S` (read and checked by `recipe.environment.lock_timeout_s`)."""
    return lock_timeout_s()


class RunLock:
    """The lock of one run folder for one command (`purpose`: "run", "resume", "geometry", "report")."""

    def __init__(self, folder: str | Path, purpose: str) -> None:
        self.folder, self.purpose = Path(folder), purpose
        self.path = self.folder / LOCK_NAME
        self.owner: dict | None = None
        self._made: list[Path] = []  # the folders `acquire` created, the deepest first: removed again if left empty
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock, or raise `RunFolderLocked` naming its live holder; a stale lock is taken over (warning)."""
        self._stale_after = stale_after_s()  # a bad HEADPROBE_LOCK_TIMEOUT is refused before anything is made
        self._made = [p for p in (self.folder, *self.folder.parents) if not p.exists()]
        self.folder.mkdir(parents=True, exist_ok=True)
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "purpose": self.purpose,
                 "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "token": os.urandom(8).hex()}
        for _ in range(50):  # a stale lock removed, or a lock being written by its maker: look again
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if self.path.is_dir():
                    raise RunFolderLocked(f"{self.path} is a folder, where headprobe keeps the run folder's lock "
                                          "file; move it out of the run folder and try again.") from None
                holder = self._read()
                if holder is not None and not self._stale(holder):
                    raise RunFolderLocked(self._held_sentence(holder)) from None
                self._take_over(holder)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(owner, f)
            self.owner = owner
            self._beat = threading.Thread(target=self._heartbeat, name="headprobe-lock-heartbeat", daemon=True)
            self._beat.start()
            return
        raise RunFolderLocked(f"{self.path} keeps being created by other commands; wait for them or use another "
                              "run folder.")

    def release(self) -> None:
        """Stop the heartbeat and remove the lock file, if it is still this command's."""
        if self.owner is None:
            return
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        if (self._read() or {}).get("token") == self.owner["token"]:
            with contextlib.suppress(OSError):
                self.path.unlink()
        self.owner = None
        for folder in self._made:  # a command that stopped before writing anything leaves no empty folder
            try:
                folder.rmdir()
            except OSError:
                break

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def _read(self) -> dict | None:
        """The holder recorded in the lock file; None when it is gone or garbage (half written by a process that
        died between creating and writing it, or a pid that names no process: -1, true, 99999999999999999999)."""
        try:
            holder = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(holder, dict) or not isinstance(holder.get("host"), str):
            return None
        pid = holder.get("pid")
        return holder if isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid <= PID_MAX else None

    def _age_s(self) -> float:
        """Seconds since the last heartbeat (negative: dated in the future, by another host's clock)."""
        try:
            return time.time() - self.path.stat().st_mtime
        except OSError:
            return float("inf")

    def _stale(self, holder: dict) -> bool:
        if holder.get("host") == socket.gethostname():
            return not process_runs(holder["pid"])
        return abs(self._age_s()) > self._stale_after

    def _take_over(self, holder: dict | None) -> None:
        """Remove a stale (or unreadable and old) lock file, with a warning; a fresh unreadable one is being
        written by its maker: wait for it."""
        age = self._age_s()
        if holder is None and abs(age) < GARBAGE_AFTER_S:
            time.sleep(0.2)
            return
        if self._read() != holder:  # replaced since it was judged: judge again
            return
        if holder is None:
            why = (f"its file names no process (it is unreadable, or its pid is no process id) and has not changed "
                   f"for {abs(age):.0f} s")
        elif holder.get("host") == socket.gethostname():
            why = "its process no longer runs"
        elif age < 0:
            why = f"its heartbeat is dated {-age:.0f} s in the future (that host's clock is off), so it proves nothing"
        else:
            why = f"it has had no heartbeat for {age:.0f} s"
        warnings.warn(f"taking over the lock of {self.folder} left by {self._describe(holder)}: {why}.",
                      stacklevel=3)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    @staticmethod
    def _describe(holder: dict | None) -> str:
        if not holder:
            return "an unknown process"
        return (f"headprobe {holder.get('purpose', '?')} (pid {holder.get('pid', '?')} on host "
                f"{holder.get('host', '?')}, started {holder.get('started', '?')})")

    def _held_sentence(self, holder: dict) -> str:
        return (f"{self.folder} is in use by {self._describe(holder)}; wait for it to finish, or write into "
                f"another folder (--out). If that process is gone, delete {self.path} and try again.")


@contextlib.contextmanager
def folder_lock(folder: str | Path, purpose: str, state=None):
    """Hold `folder`'s lock for the block. With several processes (`state`: accelerate's) only the main one takes it
    and tells the others whether it could: every process raises the same `RunFolderLocked`, or none does."""
    from headprobe.parallel.collectives import all_objects

    world = state.num_processes if state is not None else 1
    lock = RunLock(folder, purpose) if state is None or state.is_main_process else None
    refusal = None
    if lock is not None:
        try:
            lock.acquire()
        except RunFolderLocked as err:
            refusal = str(err)
    refusal = all_objects(refusal, world)[0]
    if refusal is not None:
        raise RunFolderLocked(refusal)
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()
