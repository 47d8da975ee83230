"""The context every stage of a run shares: the recipe, the run folder, the results being written, the clock, the
accelerate state, progress bars and the time estimate. `RunContext.stage` records a failure (or Ctrl-C) in
`results.json` before it propagates, so finished work stays on disk and `--resume` goes on from it.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headprobe.parallel.peers import lost_peers, lost_sentence, timed_out, timeout_sentence
from headprobe.pipeline.executors import LocalProbes, LocalSeeds, ProbeExecutor, SeedExecutor
from headprobe.recipe import Recipe, RecipeError
from headprobe.record.directory import RunDir
from headprobe.record.writer import RecordWriter


class RunError(RuntimeError):
    """A failure while running; says which stage failed. Finished work is already on disk."""

    def __init__(self, stage: str, err: BaseException, run_dir: Path | None) -> None:
        where = f" (partial results kept in {run_dir})" if run_dir else ""
        super().__init__(f"while {stage}: {type(err).__name__}: {err}{where}")
        self.stage, self.run_dir = stage, run_dir


@dataclass
class RunContext:
    """What every stage shares: the recipe, the record's one writer (`record.writer.RecordWriter`), the process
    state, the executors chosen where the run started (`pipeline.executors`: probes and seeds, local or shared),
    whether progress is shown, the processes' (host, pid) of a multi-process run (`parallel.peers`), the bootstrap
    resamples every tap shares (`taps.draw_resamples`), the first probed tap's seconds (the time estimate) and the
    last stage begun."""

    recipe: Recipe
    record: RecordWriter
    state: Any
    probes: ProbeExecutor = field(default_factory=LocalProbes)
    seeds: SeedExecutor = field(default_factory=LocalSeeds)
    show: bool = False
    peers: list = field(default_factory=list)
    resamples: dict = field(default_factory=dict)
    first_probe_s: float | None = None
    last_stage: str = "starting the run"

    def stage(self, name: str, fn, *args, **kwargs):
        self.last_stage = name
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt as stop:
            # Ctrl-C or a scheduler's SIGTERM: say so in results.json (not "running" forever); finished stages stay
            # and --resume goes on.
            self.record_interrupt(name, stop)
            raise
        except RecipeError:
            raise
        except Exception as err:
            self.record_stop("failed", name, f"{type(err).__name__}: {err}", report=self.recipe.report)
            raise RunError(name, err, self.record.path if self.record.writable else None) from err

    @contextmanager
    def recording_stops(self):
        """Around a whole run: a Ctrl-C or failure that lands between stages (while intervals or a verdict are
        being recorded, say) is recorded in results.json too, naming the last stage begun. Inside a stage,
        `stage` has already recorded it and this adds nothing (`record_stop` writes only a running run).
        SIGTERM and SIGUSR1 count as Ctrl-C while inside (`parallel.signals.stop_signals`)."""
        from headprobe.parallel.signals import stop_signals

        try:
            with stop_signals():
                yield self
        except KeyboardInterrupt as stop:
            self.record_interrupt(f"after {self.last_stage}", stop)
            raise
        except (RecipeError, RunError):
            raise
        except OSError as err:  # a full disk or read-only folder: the CLI names the file; record it if it can be
            try:
                self.record_stop("failed", f"after {self.last_stage}", f"{type(err).__name__}: {err}", report=False)
            except OSError:
                pass
            raise
        except Exception as err:
            self.record_stop("failed", f"after {self.last_stage}", f"{type(err).__name__}: {err}", report=False)
            raise RunError(f"after {self.last_stage}", err,
                           self.record.path if self.record.writable else None) from err

    def record_interrupt(self, stage: str, stop: KeyboardInterrupt | None = None) -> None:
        """A Ctrl-C (or a stop signal: `parallel.signals.StopSignal`) at `stage`, recorded with the command that
        goes on from the finished work."""
        from headprobe.parallel.signals import StopSignal

        cause = stop.name if isinstance(stop, StopSignal) else "KeyboardInterrupt"
        self.record_stop("interrupted", stage, f"interrupted ({cause}); finished stages are kept: "
                         f"`headprobe run RECIPE --resume --out {self.record.path}`", report=False)

    def record_stop(self, status: str, stage: str, message: str, report: bool) -> None:
        """Write why the run stopped into results.json. Only the run in progress records it; a later analysis
        of a recorded run (`headprobe geometry`) that fails leaves that run's status, error and report alone."""
        if not self.record.running:
            return
        lost = lost_peers(self.peers, self.state.process_index) if self.peers else []
        if lost:  # the run stopped because a process was lost (killed, out of memory): say so, whatever came here
            status = "failed"
            message = (f"{lost_sentence(lost, len(self.peers), stage)} ({message}); finished stages are kept: "
                       f"`headprobe run RECIPE --resume --out {self.record.path}`")
        elif self.peers and timed_out(message):
            status, message = "failed", f"{timeout_sentence(len(self.peers), stage)} ({message})"
        survivors = [p.rank for p in self.peers if p not in lost]
        # When the main process, which writes, is gone, the first survivor marks the results last written.
        main_lost = any(p.rank == 0 for p in lost) and bool(survivors) and self.state.process_index == survivors[0]
        if self.record.stop(status, stage, message, main_lost=main_lost) and report and not main_lost:
            write_report(self.record.run_dir)

    def clock(self, key: str, seconds: float) -> None:
        """`seconds` more of stage `key` into the record; the first probed tap's time is what each other tap will
        cost (the time estimate)."""
        self.record.add_time(key, seconds)
        if key == "probe_s" and self.first_probe_s is None:
            self.first_probe_s = seconds
            self.announce_estimate("probing")

    def head_taps_done(self) -> int:
        return sum(1 for tap in self.record.record.get("taps", {}).values() if tap.get("head") is not None)

    def announce_estimate(self, after: str) -> None:
        """Print the remaining-time estimate (`time_estimate.remaining_estimate`) to stderr when the run shows
        progress."""
        from headprobe.pipeline.time_estimate import remaining_estimate

        line = remaining_estimate(self.recipe, self.record.timing, self.first_probe_s, self.head_taps_done(), after)
        if line and self.show:
            print(line, file=sys.stderr)

    def progress(self):
        """A stage's progress display (`report.progress.stage_progress`): bars in a terminal, lines in a log."""
        from headprobe.report.progress import stage_progress

        return stage_progress(self.show)


def write_report(run_dir: RunDir) -> None:
    """report.html + plots/; never fails a run over its report (`headprobe report RUN_DIR` rebuilds it)."""
    if not run_dir.writable:
        return
    from headprobe.report.html import write_report as write_html

    try:
        write_html(run_dir.path)
    except Exception as err:
        print(f"warning: report.html not written ({type(err).__name__}: {err}); "
              f"run `headprobe report {run_dir.path}` to retry.", file=sys.stderr)
