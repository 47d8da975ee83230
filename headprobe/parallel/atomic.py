"""Files replaced whole or not at all: written to a temporary next to the target, then renamed over it.

A reader in another process (a peer on a shared file system, a resumed run, `headprobe report`) sees the old file or
the new one, never half of one; a write cut short by Ctrl-C, SIGTERM or a full disk removes its temporary and leaves
the target as it was.

>>> import tempfile, pathlib
>>> target = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
>>> replace_atomically(target, lambda tmp: tmp.write_text("new"))
>>> target.read_text(), sorted(p.name for p in target.parent.iterdir())
('new', ['a.txt'])
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["remove_stale_temporaries", "replace_atomically", "writer_alive"]


def replace_atomically(path: Path | str, write: Callable[[Path], object]) -> None:
    """write(temporary path), then rename the temporary over `path` (its folder created if missing). On any
    exception, KeyboardInterrupt included, the temporary is removed and the exception propagates."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # pid and thread: a heartbeat thread (`parallel.liveness`) may write the record while the main thread does.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def writer_alive(pid: int) -> bool:
    """Whether process `pid` is alive on this host (a pid that is not ours to signal counts as alive)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0  # alive but not ours, or not a pid at all (then not alive)
    return True


def remove_stale_temporaries(folder: Path | str) -> list[Path]:
    """Remove the temporaries `replace_atomically` left under `folder` when its writer was killed (SIGKILL, a lost
    node: no clean-up ran), i.e. those whose writer's pid is no longer alive on this host; a live writer's are kept.
    Returns the removed paths. Called when a run resumes, before anything is written."""
    removed = []
    for tmp in Path(folder).rglob(".*.tmp"):
        parts = tmp.name.rsplit(".", 3)  # ".name", pid, thread, "tmp"
        if len(parts) != 4 or not parts[1].isdigit() or writer_alive(int(parts[1])):
            continue
        with contextlib.suppress(OSError):
            tmp.unlink()
            removed.append(tmp)
    return removed
