"""Progress of a run's stages: rich's bars in a terminal, plain lines at a steady interval in a log file.

Piped to a file (a SLURM log, `nohup`), rich draws its bars only when each stage ends, so an 85-minute extraction
printed nothing for 85 minutes (issue 31). When standard output is not a terminal, `LineProgress` prints one line
per task every ``HEADPROBE_PROGRESS_INTERVAL`` seconds (default 30) and when a task completes, to stderr:

    [progress] extract train features: 1,200/5,000 (24%), 45.1/s, ~1 min 24 s left

Both offer what the stages call: ``with progress:``, ``add_task(label, total=, completed=)``, ``advance(task, n)``.

>>> import io
>>> out = io.StringIO()
>>> ticks = iter(range(100))
>>> with LineProgress(out, interval=0, clock=lambda: float(next(ticks))) as p:
...     task = p.add_task("probing", total=2)
...     p.advance(task)
...     p.advance(task)
>>> print(out.getvalue(), end="")
[progress] probing: 1/2 (50%), 1/s, ~1 s left
[progress] probing: 2/2 (100%), 1/s, done in 2 s
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

__all__ = ["DEFAULT_INTERVAL_S", "FollowedCount", "LineProgress", "progress_interval", "stage_progress"]

DEFAULT_INTERVAL_S = 30.0


def progress_interval(environ=None) -> float:
    """Seconds between progress lines: ``HEADPROBE_PROGRESS_INTERVAL`` (0: a line at every step), else 30."""
    text = (os.environ if environ is None else environ).get("HEADPROBE_PROGRESS_INTERVAL", "").strip()
    if not text:
        return DEFAULT_INTERVAL_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        raise ValueError(f"HEADPROBE_PROGRESS_INTERVAL={text!r} is not a number of seconds >= 0; set it to e.g. 60, "
                         "or unset it for a line every 30 s.")
    return value


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


@dataclass
class _Task:
    label: str
    total: float | None
    done: float
    started: float
    done_at_start: float


class LineProgress:
    """Plain progress lines for a log file: each task's done/total, rate and the time left, at most every
    `interval` seconds per progress display, and once when a task completes."""

    def __init__(self, stream: TextIO | None = None, interval: float = DEFAULT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream, self.interval, self.clock = stream if stream is not None else sys.stderr, interval, clock
        self.tasks: list[_Task] = []
        self.last_line: float | None = None

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def add_task(self, description: str, total: float | None = None, completed: float = 0, **_: object) -> int:
        self.tasks.append(_Task(description, total, completed, self.clock(), completed))
        return len(self.tasks) - 1

    def advance(self, task_id: int, advance: float = 1) -> None:
        task = self.tasks[task_id]
        task.done += advance
        now = self.clock()
        finished = task.total is not None and task.done >= task.total
        if finished or self.last_line is None or now - self.last_line >= self.interval:
            self.last_line = now
            print(self.line(task, now), file=self.stream, flush=True)

    def line(self, task: _Task, now: float) -> str:
        elapsed = max(now - task.started, 1e-9)
        rate = (task.done - task.done_at_start) / elapsed
        counts = f"{task.done:,.0f}"
        if task.total:
            counts += f"/{task.total:,.0f} ({100 * task.done / task.total:.0f}%)"
        text = f"[progress] {task.label}: {counts}, {rate:.3g}/s"
        if task.total is not None and task.done >= task.total:
            return f"{text}, done in {_duration(elapsed)}"
        if task.total and rate > 0:
            text += f", ~{_duration((task.total - task.done) / rate)} left"
        return text


def stage_progress(show: bool):
    """The progress display of one stage: nothing shown (`show` false: another process, or quiet), rich's bars
    when standard output is a terminal, else `LineProgress` on stderr."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    if show and not sys.stdout.isatty():
        return LineProgress(sys.stderr, progress_interval())
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    disable=not show, transient=False)


class FollowedCount:
    """Inside ``with``: task `task` of `progress` follows a count that other processes raise too (`read()`: the count
    now, None where it cannot be read), checked every `poll` seconds on a background thread, so the main process of
    a shared stage shows the whole stage's done/total while it works or waits for the others. On leaving, the task
    is brought to the count once more (the others have added theirs by then).

    >>> import io
    >>> out, ticks = io.StringIO(), iter(range(100))
    >>> with LineProgress(out, interval=0, clock=lambda: float(next(ticks))) as p:
    ...     task = p.add_task("probing 2 taps", total=5)
    ...     with FollowedCount(p, task, total=5, read=lambda: 5, poll=3600):
    ...         pass
    >>> print(out.getvalue(), end="")
    [progress] probing 2 taps: 5/5 (100%), 5/s, done in 1 s
    """

    def __init__(self, progress, task: int, total: int, read: Callable[[], int | None], poll: float = 0.5) -> None:
        self.progress, self.task, self.total, self.read, self.poll = progress, task, total, read, poll
        self.shown = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._follow, name="headprobe-progress", daemon=True)

    def __enter__(self) -> FollowedCount:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        count = self.read()
        if count is not None:
            self._show(count)

    def _follow(self) -> None:
        while not self.stop.wait(self.poll):
            count = self.read()
            if count is None:
                return
            self._show(count)

    def _show(self, count: int) -> None:
        count = min(count, self.total)
        if count > self.shown:
            self.progress.advance(self.task, count - self.shown)
            self.shown = count
