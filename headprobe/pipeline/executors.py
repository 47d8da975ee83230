"""Where the work of a run goes: the one seam between the stages and the number of processes.

A run chooses its executors once, where it starts (`executors_for`): one process runs every probe and trains every
seed itself (`LocalProbes`, `LocalSeeds`); several share them out (`probe_sharing.SharedProbes`,
`seed_sharing.SharedSeeds`). The stages, the taps and the probing ask the executor and never the process count.
Both kinds give the same numbers (tests/test_distributed.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from headprobe.pipeline.probe_sharing import SharedProbes
from headprobe.pipeline.seed_sharing import SharedSeeds
from headprobe.pipeline.taps import run_probes
from headprobe.record.writer import RecordWriter, TapSummary

__all__ = ["LocalProbes", "LocalSeeds", "ProbeExecutor", "SeedExecutor", "executors_for"]


class ProbeExecutor(Protocol):
    """Runs the pending probes of a run's units ((tap, seed) pairs) and hands every output to the record."""

    # Whether the backbone tap is probed together with the head taps, so its probes are shared out with theirs.
    backbone_with_heads: bool

    def start_clock(self) -> float:
        """The start of a probing stage's clock, once every process is there."""

    def all_agree(self, flag: bool) -> bool:
        """Whether `flag` holds on every process."""

    def run(self, ctx, features, units: list, pending: list[list[str]], record: RecordWriter) -> None:
        """Every pending probe of each unit, recorded (`RecordWriter.probe`) in the one-process order."""

    def summaries(self, tap_names: list[str], compute: Callable[[str], TapSummary], record: RecordWriter
                  ) -> list[TapSummary]:
        """compute(tap) for every tap (intervals, seed aggregates), each summary handed to the record; returns
        them all."""

    def probed_intervals(self, tap: str, metrics: dict) -> dict | None:
        """The intervals computed next to the probes of `tap`, where every metric has one; else None."""


class SeedExecutor(Protocol):
    """Trains every seed's heads (`train_one(seed, log)` trains one)."""

    def writes_checkpoints(self, seeds: list[int], record: RecordWriter) -> bool:
        """Whether this process writes its seeds' checkpoints into the run directory."""

    def train(self, ctx, seeds: list[int], specs, dim: int, train_one, log) -> dict:
        """{seed: (head states, summary)} for every seed."""

    def stage_seconds(self, seeds: list[int], seconds: dict[int, float]) -> float:
        """The training stage's time from each seed's."""


class LocalProbes:
    """One process: every probe in order, each recorded as it finishes (an interrupted run keeps it)."""

    backbone_with_heads = False

    def start_clock(self) -> float:
        return time.perf_counter()

    def all_agree(self, flag: bool) -> bool:
        return flag

    def run(self, ctx, features, units: list, pending: list[list[str]], record: RecordWriter) -> None:

        total = sum(len(names) for names in pending)
        with ctx.progress() as progress:
            label = f"probing {len(units)} tap{'s' if len(units) > 1 else ''}"
            task = progress.add_task(label, total=total) if total else None
            for (tap, seed), names in zip(units, pending, strict=True):
                for name, out in run_probes(ctx, features, tap, seed, names):
                    record.probe(tap.name, seed, name, out)
                    progress.advance(task)

    def summaries(self, tap_names: list[str], compute: Callable[[str], TapSummary], record: RecordWriter
                  ) -> list[TapSummary]:
        done = [compute(name) for name in tap_names]
        for summary in done:
            record.summary(summary, write=False)
        return done

    def probed_intervals(self, tap: str, metrics: dict) -> dict | None:
        return None


class LocalSeeds:
    """One process: every seed trained here, one after another."""

    def writes_checkpoints(self, seeds: list[int], record: RecordWriter) -> bool:
        return record.writable

    def train(self, ctx, seeds: list[int], specs, dim: int, train_one, log) -> dict:
        return {seed: train_one(seed, lambda entry, seed=seed: log(entry, seed)) for seed in seeds}

    def stage_seconds(self, seeds: list[int], seconds: dict[int, float]) -> float:
        return sum(seconds.values())


def executors_for(state: Any) -> tuple[ProbeExecutor, SeedExecutor]:
    """The probe and seed executors of a run on `state`'s processes: local for one, shared for several."""
    if state.num_processes == 1:
        return LocalProbes(), LocalSeeds()

    return SharedProbes(state), SharedSeeds(state)
