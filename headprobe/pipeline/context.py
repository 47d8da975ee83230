"""The context every stage of a run shares: the recipe, the run folder, the results being written, the clock, the
accelerate state, progress bars and the time estimate. `with ctx.stage(name):` around a stage's work records a failure
(or Ctrl-C) in `results.json` before it propagates, so finished work stays on disk and `--resume` goes on from it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headprobe.features.cache import UnchangedCache
from headprobe.parallel.liveness import PeerWatch, frozen_sentence
from headprobe.parallel.peers import LOST_WAIT_S, lost_peers, lost_sentence, timed_out, timeout_sentence
from headprobe.parallel.signals import StopSignal, stop_signals
from headprobe.pipeline.executors import LocalProbes, LocalSeeds, ProbeExecutor, SeedExecutor
from headprobe.pipeline.time_estimate import remaining_estimate
from headprobe.recipe import Recipe, RecipeError
from headprobe.record.directory import RunDir
from headprobe.record.writer import RecordWriter
from headprobe.report.html import write_report as write_html
from headprobe.report.progress import stage_progress


class RunError(RuntimeError):
    """A failure while running; says which stage failed. Finished work is already on disk."""

    def __init__(self, stage: str, err: BaseException, run_dir: Path | None) -> None:
        where = f" (partial results kept in {run_dir})" if run_dir else ""
        super().__init__(f"while {stage}: {type(err).__name__}: {err}{where}")
        self.stage, self.run_dir = stage, run_dir


class PeerStop(RunError):
    """The run failed because another process was lost, failed, froze or did not answer a collective in time;
    the message is the sentence results.json records. `speaks`: whether this process is the one that says it (the
    first that is left), so that a run prints it once, not once per process."""

    def __init__(self, stage: str, message: str, run_dir: Path | None, speaks: bool) -> None:
        RuntimeError.__init__(self, message)
        self.stage, self.run_dir, self.speaks = stage, run_dir, speaks


@dataclass
class RunContext:
    """What every stage shares: the recipe, the record's one writer (`record.writer.RecordWriter`), the process
    state, the executors chosen where the run started (`pipeline.executors`: probes and seeds, local or shared),
    whether progress is shown, the processes' (host, pid) of a multi-process run (`parallel.peers`) and their
    heartbeats (`parallel.liveness`, from `watching_peers`), the bootstrap resamples every tap shares
    (`taps.draw_resamples`), the first probed tap's seconds (the time estimate), the last stage begun, and the
    guard of the memory-mapped cache files the stages read (`reading`)."""

    recipe: Recipe
    record: RecordWriter
    state: Any
    probes: ProbeExecutor = field(default_factory=LocalProbes)
    seeds: SeedExecutor = field(default_factory=LocalSeeds)
    show: bool = False
    peers: list = field(default_factory=list)
    watch: Any = None
    resamples: dict = field(default_factory=dict)
    first_probe_s: float | None = None
    last_stage: str = "starting the run"
    cache: UnchangedCache | None = None

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Around one stage's work (`with ctx.stage("extracting train features"): ...`): a failure or Ctrl-C inside
        is recorded in results.json under `name` before it propagates (a failure as `RunError`, or `PeerStop` when
        another process was lost); a RecipeError passes as it is. The stage ends by verifying the cache files it
        read (`verify_cache`), so nothing computed from bytes that changed under the run leaves it."""
        self.last_stage = name
        try:
            yield
            self.verify_cache()
        except KeyboardInterrupt as stop:
            # Ctrl-C or a scheduler's SIGTERM: say so in results.json (not "running" forever); finished stages stay
            # and --resume goes on. The SIGTERM torchrun sends after a process died is that process's failure.
            peer_stop = self.record_interrupt(name, stop)
            if peer_stop is not None:
                raise peer_stop from None
            raise
        except RecipeError:
            raise
        except Exception as err:
            peer_stop = self.record_stop("failed", name, f"{type(err).__name__}: {err}", report=self.recipe.report)
            if peer_stop is not None:
                raise peer_stop from err
            raise RunError(name, err, self.record.path if self.record.writable else None) from err

    def reading(self, features) -> None:
        """From here on the stages read `features` (a `stages.FeatureSet`): its memory-mapped cache files
        (`FeatureSet.read`) are verified as each stage ends. Only the main process, which records, checks them."""
        self.cache = UnchangedCache(features.read()) if self.record.writable else None

    def verify_cache(self, final: bool = False) -> None:
        """`features.cache.CacheChangedError` when a cache file read changed on disk since it was verified
        (`UnchangedCache.check`: its identity every time, its checksums at most 1/100 of the time, and always when
        `final`: before the record is completed)."""
        if self.cache is not None:
            self.cache.check(final)

    @contextmanager
    def recording_stops(self):
        """Around a whole run: a Ctrl-C or failure that lands between stages (while intervals or a verdict are
        being recorded, say) is recorded in results.json too, naming the last stage begun. Inside a stage,
        `stage` has already recorded it and this adds nothing (`record_stop` writes only a running run).
        SIGTERM and SIGUSR1 count as Ctrl-C while inside (`parallel.signals.stop_signals`)."""

        try:
            with stop_signals():
                yield self
        except KeyboardInterrupt as stop:
            peer_stop = self.record_interrupt(f"after {self.last_stage}", stop)
            if peer_stop is not None:
                raise peer_stop from None
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
            peer_stop = self.record_stop("failed", f"after {self.last_stage}", f"{type(err).__name__}: {err}",
                                         report=False)
            if peer_stop is not None:
                raise peer_stop from err
            raise RunError(f"after {self.last_stage}", err,
                           self.record.path if self.record.writable else None) from err

    @contextmanager
    def watching_peers(self, timeout_s: float):
        """Around a whole multi-process run: every process beats and watches the others' heartbeats
        (`parallel.liveness.PeerWatch`), so a frozen one fails the run within `timeout_s` seconds
        (`stop_for_frozen`); on the way out this process tells the others it ended. Nothing with one process."""

        self.watch = PeerWatch(self.peers, self.state.process_index, timeout_s, self.stop_for_frozen)
        self.watch.start()
        try:
            yield self
        finally:
            self.watch.end(self.record.status or "failed")
            self.watch.linger(LOST_WAIT_S + 2.0)

    def stop_for_frozen(self, frozen: list) -> None:
        """In the heartbeat thread, when `frozen` (`parallel.peers.Peer`s) stopped beating: record the run failed
        naming them and the stage, say so once (the first process left), and end this process with exit code 1. Its
        main thread may be waiting in a collective only the frozen process could complete, so it cannot be
        unwound."""

        stage = self.last_stage
        message = (f"{frozen_sentence(frozen, len(self.peers), stage, self.watch.timeout_s)}; finished stages are "
                   f"kept: `headprobe run RECIPE --resume --out {self.record.path}`")
        left = [p.rank for p in self.peers if p not in frozen]
        speaks = bool(left) and self.state.process_index == left[0]
        try:
            if self.record.running:
                self.record.stop("failed", stage, message, main_lost=speaks and any(p.rank == 0 for p in frozen))
        except Exception as err:  # still say why the run stopped, and stop it
            message += f" (results.json not updated: {type(err).__name__}: {err})"
        self.watch.end("failed", stage, message)
        if speaks:
            print(f"error: {message}", file=sys.stderr, flush=True)
        os._exit(1)

    def record_interrupt(self, stage: str, stop: KeyboardInterrupt | None = None) -> PeerStop | None:
        """A Ctrl-C (or a stop signal: `parallel.signals.StopSignal`) at `stage`, recorded with the command that
        goes on from the finished work; a PeerStop when it came because another process was lost (`record_stop`)."""

        cause = stop.name if isinstance(stop, StopSignal) else "KeyboardInterrupt"
        return self.record_stop("interrupted", stage, f"interrupted ({cause}); finished stages are kept: "
                                f"`headprobe run RECIPE --resume --out {self.record.path}`", report=False,
                                cause=f"this process was then stopped by {cause}")

    def record_stop(self, status: str, stage: str, message: str, report: bool,
                    cause: str | None = None) -> PeerStop | None:
        """Write why the run stopped into results.json. Only the run in progress records it; a later analysis
        of a recorded run (`headprobe geometry`) that fails leaves that run's status, error and report alone.
        With several processes the stop may be another's doing: one was lost (killed, out of memory) or failed
        (it said so: `parallel.liveness`), or a collective timed out; the run is then recorded "failed" with that
        sentence (`cause`, else `message`, in brackets) and the PeerStop to raise is returned."""
        if not self.record.running:
            return None
        failed = self._failed_peers()
        speaker = [p.rank for p in self.peers if p not in failed][:1]
        peer_stop = None
        if failed:
            status = "failed"
            message = (f"{self._failed_sentence(failed, stage)} ({cause or message}); finished stages are kept: "
                       f"`headprobe run RECIPE --resume --out {self.record.path}`")
        elif self.peers and timed_out(message):
            status, message = "failed", f"{timeout_sentence(len(self.peers), stage)} ({message})"
            speaker = [0]
        if status == "failed" and self.peers and (failed or timed_out(message)):
            peer_stop = PeerStop(stage, message, self.record.path if self.record.writable else None,
                                 speaks=speaker == [self.state.process_index])
        if self.watch is not None:  # how this process ended, for the others to read
            self.watch.end(status, stage, message)
        # When the main process, which writes, is gone, the first survivor marks the results last written.
        main_lost = any(p.rank == 0 for p in failed) and speaker == [self.state.process_index]
        if self.record.stop(status, stage, message, main_lost=main_lost) and report and not main_lost:
            write_report(self.record.run_dir)
        return peer_stop

    def _failed_peers(self) -> list:
        """The other processes that are gone (`parallel.peers.lost_peers`) without ending as this one does: lost,
        or ended "failed" on their own (a process that stopped on the same Ctrl-C, or finished, is not)."""
        if not self.peers:
            return []
        gone = lost_peers(self.peers, self.state.process_index)
        said = {p.rank: self.watch.ended(p.rank) if self.watch is not None else None for p in gone}
        return [p for p in gone if said[p.rank] is None or said[p.rank]["status"] == "failed"]

    def _failed_sentence(self, failed: list, stage: str) -> str:
        """"process 1 of 2 (...) was lost while <stage>", or for a process that said why it failed, "process 1
        of 2 (...) failed while <its stage>: <its message>"."""
        said = [self.watch.ended(p.rank) if self.watch is not None else None for p in failed]
        if len(failed) == 1 and said[0] is not None:
            p, how = failed[0], said[0]
            when = how["stage"] if how["stage"].startswith("after ") else f"while {how['stage']}"
            return f"process {p.rank} of {len(self.peers)} (pid {p.pid} on {p.host}) failed {when}: {how['message']}"
        return lost_sentence(failed, len(self.peers), stage)

    def clock(self, key: str, seconds: float) -> None:
        """`seconds` more of stage `key` into the record; the first probed tap's time is what each other tap will
        cost (the time estimate)."""
        self.record.add_time({key: seconds})
        if key == "probe_s" and self.first_probe_s is None:
            self.first_probe_s = seconds
            self.announce_estimate("probing")

    def head_taps_done(self) -> int:
        return self.record.head_taps

    def announce_estimate(self, after: str) -> None:
        """Print the remaining-time estimate (`time_estimate.remaining_estimate`) to stderr when the run shows
        progress."""

        line = remaining_estimate(self.recipe, self.record.timing, self.first_probe_s, self.head_taps_done(), after)
        if line and self.show:
            print(line, file=sys.stderr)

    def progress(self):
        """A stage's progress display (`report.progress.stage_progress`): bars in a terminal, lines in a log."""

        return stage_progress(self.show)


def write_report(run_dir: RunDir) -> None:
    """report.html + plots/; never fails a run over its report (`headprobe report RUN_DIR` rebuilds it)."""
    if not run_dir.writable:
        return

    try:
        write_html(run_dir.path)
    except Exception as err:
        print(f"warning: report.html not written ({type(err).__name__}: {err}); "
              f"run `headprobe report {run_dir.path}` to retry.", file=sys.stderr)
