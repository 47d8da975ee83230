"""The one writer of a run's record: `results.json`, `metrics.jsonl` and the per-unit stores (`per_unit/*.safetensors`).

The stages of a run compute and return typed values; at each stage's end the stage puts them into the record
(`RecordWriter.put`: a section, or a place within one, and the value, serialised by its `to_record()` where it has
one), and the writer alone changes the record and writes it (`RunDir.write_results` at every put unless told
`write=False`, so a failure keeps everything computed before it). What goes where is the stage's (or the typed
value's) to say; the writer knows the record's bookkeeping only: time, the probed units and their per-unit stores,
the run's status. It owns resume too: what a resumed run takes from the record it continues (`RecordWriter.begin`:
the finished taps, the probing and training time, the earlier invocations) and the per-unit values of the probes it
does not run again (`open_unit`).

>>> writer = RecordWriter(RunDir("runs/x", writable=False), {"taps": {}, "timing": {}}, invocation=None)
>>> writer.open_unit("backbone", None, 0, None)
set()
>>> writer.add_time({"probe_s": 2.0}); writer.add_time({"probe_s": 1.0}); writer.record["timing"]
{'probe_s': 3.0}
>>> writer.put(("protocol", "train"), {"epochs": 1}, write=False); writer.record["protocol"]
{'train': {'epochs': 1}}
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from headprobe.parallel.atomic import remove_stale_temporaries
from headprobe.recipe import RecipeError
from headprobe.record.directory import RunDir, metrics_from_json, new_results
from headprobe.record.results import RunRecord
from headprobe.stats.bootstrap import load_per_unit, save_per_unit
from headprobe.stats.measures import TapMeasures, tap_measures

__all__ = ["RecordWriter", "TapSummary", "unit_key"]

# The stages whose time a resumed run keeps: finished probes are not redone, and training resumed from a checkpoint
# adds its time to the recorded one. Every other stage is redone and re-timed.
KEPT_ON_RESUME = ("probe_s", "train_s")

# The longest a recorded probe output waits for results.json (`RecordWriter.probe`).
WRITE_INTERVAL_S = 2.0


def unit_key(tap: str, seed: int | None) -> str:
    """The name of one probed unit (a tap, and a seed where there are several): its per-unit store's file name."""
    return tap if seed is None else f"{tap}.seed-{seed}"


@dataclass
class TapSummary:
    """What a tap's intervals (or its seeds' aggregate) set: the uncertainty records, and for a seed aggregate its
    metrics, protocol and per-unit values (the seed means)."""

    tap: str
    uncertainty: dict
    metrics: dict | None = None
    protocol: dict | None = None
    per_unit: dict | None = None


def _serialised(value: Any) -> Any:
    """A typed value's record (`to_record()`), or a mapping's with each such value's; anything else as it is."""
    if hasattr(value, "to_record"):
        return value.to_record()
    if isinstance(value, Mapping) and any(hasattr(v, "to_record") for v in value.values()):
        return {k: v.to_record() if hasattr(v, "to_record") else v for k, v in value.items()}
    return value


def _what_it_computes(recipe: dict | None) -> dict | None:
    """A recorded recipe without `runtime` (how the machine is used, not what is computed): a resumed run may use
    other threads."""
    return {k: v for k, v in recipe.items() if k != "runtime"} if isinstance(recipe, dict) else recipe


def differing_keys(recorded, given, prefix: str = "") -> list[str]:
    """The dotted keys where two recipes (as dicts) differ, "train.epochs (recorded 5, now 2)", depth first."""
    if isinstance(recorded, dict) and isinstance(given, dict):
        out = []
        for key in [*recorded, *(k for k in given if k not in recorded)]:
            path = f"{prefix}{key}"
            if key not in given:
                out.append(f"{path} (recorded {recorded[key]!r}, now absent)")
            elif key not in recorded:
                out.append(f"{path} (absent from the record, now {given[key]!r})")
            else:
                out += differing_keys(recorded[key], given[key], f"{path}.")
        return out
    return [] if recorded == given else [f"{prefix.rstrip('.')} (recorded {recorded!r}, now {given!r})"]


class RecordWriter:
    """The record of one run (`record`, a `RunRecord`) and the only code that changes or writes it. `run_dir` is
    read-only on every process but the main one, so the others keep the same record in memory and write nothing.
    `per_unit`: the probes' per-image values by unit (`unit_key`), as the per-unit stores hold them."""

    def __init__(self, run_dir: RunDir, record: RunRecord, invocation: dict | None, resume: bool = False,
                 timing: dict | None = None) -> None:
        """`invocation`: this invocation's entry in record["invocations"], None for an analysis of a recorded run;
        `timing`: where the stages' seconds go, record["timing"] unless given (an analysis keeps its own)."""
        self.run_dir, self.record, self.invocation, self.resume = run_dir, record, invocation, resume
        self.timing: dict = record["timing"] if timing is None else timing
        self.per_unit: dict[str, dict] = {}
        # Probes in the record whose per-unit values are not yet in their store, by unit key: (the unit's record,
        # probe name, its metric names). results.json never lists a probe before its store holds its values, or a
        # resumed run would take the probe as done and its intervals as unavailable.
        self._unsaved: dict[str, list[tuple[dict, str, list[str]]]] = {}
        # results.json is rewritten whole with the stores of the probes since (a write after every probe took a
        # fifth of the quickstart's probing: benchmarks/README.md, "Measurements quoted by the modules"): a probe's
        # output waits up to `write_interval_s` for the next write; `flush`, `stop` and every other write take it
        # along, so only a process killed outright (SIGKILL) loses those seconds of probing, which a resumed run
        # redoes.
        self.write_interval_s = WRITE_INTERVAL_S
        self._written_at = -math.inf
        self._write_pending = False

    # --- starting, resuming -------------------------------------------------------------------------------------

    @staticmethod
    def begin(recipe: dict, path: Path, resume: bool,
              refuse_existing: bool) -> tuple[RunRecord, dict, RunRecord | None]:
        """(the new record, this invocation's entry in it, the earlier record when it is already complete: nothing
        to redo). Resuming, the record takes the earlier one's taps (NaN restored), the time of the stages it does
        not redo (`KEPT_ON_RESUME`) and its invocations; RecipeError for a resume without a run or with another
        recipe, or (`refuse_existing`: --out given) a new run into a folder holding one."""
        results = new_results(recipe)
        invocation = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "resume": resume,
                      "status": "running", "timing": {}}
        results["invocations"] = [invocation]
        if not resume:
            if refuse_existing and (path / "results.json").exists():
                raise RecipeError(f"--out {path} already holds a run; pass --resume to continue it or choose another "
                                  "--out.")
            return results, invocation, None
        if not (path / "results.json").is_file():
            raise RecipeError(f"--resume needs --out pointing at an earlier run; {path}/results.json does not exist.")
        try:
            previous = RunDir(path).read_results()
        except ValueError as err:
            raise RecipeError(f"--resume: {err}") from None
        if _what_it_computes(previous.get("recipe")) != _what_it_computes(recipe):
            keys = differing_keys(_what_it_computes(previous.get("recipe")), _what_it_computes(recipe))
            shown = "; ".join(keys[:5]) + (f"; and {len(keys) - 5} more" if len(keys) > 5 else "")
            raise RecipeError(
                f"--resume: the recipe differs from the one recorded in {path}/results.json at {shown}; resume "
                f"with the same recipe and overrides (`headprobe run --resume --out {path}` reads the recorded "
                "one), or start a new run with another --out."
            )
        if previous.get("status") == "complete":
            return results, invocation, previous
        remove_stale_temporaries(path)  # a killed run's half-written files (kill -9: no clean-up ran)
        results["taps"] = metrics_from_json(previous.get("taps", {}))  # null (NaN in JSON) back to NaN
        results["timing"] = {k: v for k, v in previous.get("timing", {}).items() if k in KEPT_ON_RESUME}
        results["invocations"] = [*previous.get("invocations", []), invocation]  # each keeps its stages' time
        return results, invocation, None

    @property
    def path(self) -> Path:
        return self.run_dir.path

    @property
    def writable(self) -> bool:
        return self.run_dir.writable

    @property
    def status(self) -> str | None:
        """The run's status as recorded ("running", "complete", "interrupted", "failed"), None before any."""
        return self.record.get("status")

    @property
    def head_taps(self) -> int:
        """How many head taps have been recorded so far (for the time estimate)."""
        return sum(1 for tap in self.record.get("taps", {}).values() if tap.get("head") is not None)

    @property
    def running(self) -> bool:
        """Whether the record is of a run in progress (not a finished one being analysed, nor a stopped one)."""
        return self.status == "running"

    def write(self) -> None:
        """results.json (and results.csv) rewritten from the record, after the per-unit stores of the probes it
        lists."""
        self._save_unsaved()
        self.run_dir.write_results(self.record)
        self._written_at, self._write_pending = time.monotonic(), False

    def flush(self) -> None:
        """The write a probe's output is waiting for (`probe`), now; nothing when none waits."""
        if self._write_pending:
            self.write()

    def log(self, entry: dict) -> None:
        """One record appended to metrics.jsonl (and handed to the trackers)."""
        self.run_dir.log_metrics(entry)

    def put(self, where: str | tuple[str, ...], value: Any, *, merge: bool = False, write: bool = True) -> None:
        """`value` into the record at `where`: a section ("data"), or a place within one (("heads", name,
        "geometry")), made on the way. A value with `to_record()` (a typed answer or verdict) is serialised by it,
        and so is each value of a mapping of them. merge: the mapping's entries update the one there (made where
        none is) instead of replacing it. write: results.json rewritten now (as every put does unless told not
        to: several puts of one stage end with one write)."""
        keys = (where,) if isinstance(where, str) else tuple(where)
        place: dict = self.record
        for key in keys[:-1]:
            place = place.setdefault(key, {})
        value = _serialised(value)
        if merge:
            place.setdefault(keys[-1], {}).update(value)
        else:
            place[keys[-1]] = value
        if write:
            self.write()

    # --- time -----------------------------------------------------------------------------------------------------

    def add_time(self, seconds: Mapping[str, float], *, restart: bool = False) -> None:
        """`seconds` more of each stage ({key: seconds}), in the run's timing and in this invocation's own; restart:
        the run's count of those stages starts again from these (a stage redone whole, not continued)."""
        for key, value in seconds.items():
            self.timing[key] = (0.0 if restart else self.timing.get(key, 0.0)) + value
            if self.invocation is not None:
                own = self.invocation["timing"]
                own[key] = own.get(key, 0.0) + value

    # --- probes ---------------------------------------------------------------------------------------------------

    def open_unit(self, tap: str, head: str | None, depth: int, seed: int | None) -> set[str]:
        """The probes already recorded at (tap, seed); makes the unit's entry and per-unit store on the way (loaded
        from the run directory when resuming)."""
        entry = self.record["taps"].setdefault(tap, {"head": head, "depth": depth, "metrics": {}, "protocol": {}})
        unit = entry if seed is None else entry.setdefault("seeds", {}).setdefault(str(seed),
                                                                                   {"metrics": {}, "protocol": {}})
        key = unit_key(tap, seed)
        self.per_unit.setdefault(key, load_per_unit(self._store(key)) if self.resume else {})
        return set(unit["protocol"])

    def probe(self, tap: str, seed: int | None, name: str, out: Any, process: int | str | None = None,
              write: bool = True) -> None:
        """One probe's output (`ProbeOutput`) into results.json, metrics.jsonl (with the process that ran it, in a
        run of several) and the per-unit store: metrics.jsonl at once, results.json and the store at the next write,
        which comes at once when the last one is `write_interval_s` old (else at `flush`, or any write after).
        write=False leaves both to the next `write`, which follows several probes recorded at once."""
        entry = self.record["taps"][tap]
        unit = entry if seed is None else entry["seeds"][str(seed)]
        unit["metrics"].update(out.metrics)
        unit["protocol"][name] = out.protocol
        self.per_unit[unit_key(tap, seed)].update(out.per_unit)
        if out.per_unit:
            self._unsaved.setdefault(unit_key(tap, seed), []).append((unit, name, list(out.metrics)))
        extra = ({} if seed is None else {"seed": seed}) | ({} if process is None else {"process": process})
        self.log({"stage": "probe", "tap": tap, **extra, "probe": name, **out.metrics})
        if write and time.monotonic() - self._written_at >= self.write_interval_s:
            self.write()
        elif write:
            self._write_pending = True

    def _store(self, key: str) -> Path:
        return self.path / "per_unit" / f"{key}.safetensors"

    def _save_unit(self, key: str) -> None:
        if self.per_unit[key] and self.writable:
            store = self._store(key)
            store.parent.mkdir(exist_ok=True)
            save_per_unit(store, self.per_unit[key])
        self._unsaved.pop(key, None)

    def _save_unsaved(self) -> None:
        """The per-unit stores of the probes recorded since their last write."""
        for key in list(self._unsaved):
            self._save_unit(key)

    def _forget_unsaved(self) -> None:
        """The probes whose per-unit values could not be saved taken out of the record (a resumed run redoes them)."""
        for pending in self._unsaved.values():
            for unit, name, metrics in pending:
                unit["protocol"].pop(name, None)
                for metric in metrics:
                    unit["metrics"].pop(metric, None)
        self._unsaved.clear()

    def reused_tap(self, tap: str, entry: dict, source: Path) -> None:
        """Tap `tap` taken whole from the finished run in `source` (`entry`: its record, `reused_from` set), with
        its per-unit values (the store copied)."""
        store = source / "per_unit" / f"{tap}.safetensors"
        self.per_unit[tap] = load_per_unit(store)
        if self.writable and store.is_file():
            (self.path / "per_unit").mkdir(exist_ok=True)
            shutil.copyfile(store, self._store(tap))
        self.record["taps"][tap] = entry
        self.write()

    def summary(self, summary: TapSummary, write: bool = True) -> None:
        """A tap's intervals, or its seeds' aggregate (metrics, protocol, per-unit seed means and intervals)."""
        tap = self.record["taps"][summary.tap]
        if summary.metrics is not None:
            tap["metrics"] = summary.metrics
        if summary.protocol is not None:
            tap["protocol"] = summary.protocol
        if summary.per_unit is not None:
            self.per_unit[summary.tap] = summary.per_unit
        tap["uncertainty"] = summary.uncertainty
        if write:
            self.write()

    def measures(self) -> dict[str, TapMeasures]:
        """Every tap's measurements recorded so far (this invocation's and, resuming, the earlier ones'), typed for
        the statistics (`stats.measures`)."""
        return tap_measures(self.record["taps"], self.per_unit)

    # --- the end ----------------------------------------------------------------------------------------------------

    def complete(self, **last: Any) -> None:
        """The run is complete: probing's cost against extraction's, the `last` sections ({section: value}, as
        `put` takes them), the status."""
        timing = self.timing
        extracted = timing.get("extract_s", 0.0) + timing.get("extract_views_s", 0.0)
        if extracted > 0:
            # Probes work on cached features: all of them together should cost less than extracting those.
            self.record.setdefault("timing_ratios", {})["probe_over_extract"] = timing.get("probe_s", 0.0) / extracted
        for section, value in last.items():
            self.put(section, value, write=False)
        self.record["status"] = "complete"
        if self.invocation is not None:
            self.invocation["status"] = "complete"
        self.write()

    def stop(self, status: str, stage: str, message: str, main_lost: bool = False) -> bool:
        """Why the run stopped, into results.json; False (nothing written) when the record is not of a run in
        progress (an analysis of a recorded run leaves its status alone). `main_lost`: the main process, which
        writes, is gone, so this one marks the results last written instead."""
        if not self.running:
            return False
        self.record["status"] = status
        self.record["error"] = {"stage": stage, "message": message}
        if self.invocation is not None:
            self.invocation["status"] = status
        if main_lost:
            self.run_dir.mark_stopped(status, self.record["error"])
            return True
        try:  # a store whose write the interrupt cut short is written now; failing that, its probes are redone
            self._save_unsaved()
        except (Exception, KeyboardInterrupt):
            self._forget_unsaved()
        self.write()
        return True
