"""The run directory: ``config.yaml``, ``results.json``, ``metrics.jsonl``, ``plots/``, ``checkpoints/``.

`results.json` is rewritten atomically (temporary file + rename) after every
finished stage, so a run that fails keeps everything it had computed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from headprobe import __version__
from headprobe.parallel.atomic import replace_atomically
from headprobe.record import results as record


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to a temporary file next to `path`, then rename it over `path`; a failed write (disk full)
    removes the temporary and leaves `path` as it was."""
    replace_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _jsonable(obj: Any) -> Any:
    """Plain JSON: tensors and numpy scalars become numbers; NaN/inf become null."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):
        return _jsonable(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def default_run_dir(name: str, root: str | Path = "runs") -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(root) / f"{name}-{stamp}"
    suffix = 1
    while path.exists():
        suffix += 1
        path = Path(root) / f"{name}-{stamp}-{suffix}"
    return path


# What `headprobe run` (and a sweep) writes into a run folder: a folder holding only these is headprobe's own.
RUN_ENTRIES = frozenset({"results.json", "results.csv", "config.yaml", "metrics.jsonl", "report.html", "plots",
                         "checkpoints", "per_unit", "compare.csv", "compare.html", "heads.safetensors", "tensorboard",
                         "wandb", "headprobe.lock"})


def check_out_folder(path: str | Path) -> None:
    """Refuse (`RecipeError`) an --out that headprobe must not write into: an existing, non-empty folder that is
    not a headprobe run (or sweep), whose own files (say a config.yaml) a run would overwrite, or a location that
    cannot be written. Called before anything is written."""
    from headprobe.recipe import RecipeError

    path = Path(path)
    if path.is_dir():
        entries = list(path.iterdir())
        ours = (path / "results.json").exists() or (path / "compare.csv").exists()
        foreign = [e.name for e in entries if e.name not in RUN_ENTRIES and not _is_temporary(e.name)
                   and not (e.is_dir() and ((e / "results.json").exists() or (e / "config.yaml").exists()))]
        if entries and not ours and foreign:
            shown = ", ".join(repr(n) for n in sorted(foreign)[:3]) + (", ..." if len(foreign) > 3 else "")
            raise RecipeError(f"--out {str(path)!r} is a folder that is not a headprobe run (it holds {shown}); "
                              "a run writes config.yaml, results.json and plots/ there and would overwrite files "
                              "of the same name. Choose a new or empty folder, or an earlier run's folder.")
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and existing.is_dir() and not os.access(existing, os.W_OK | os.X_OK):
        where = "is" if existing == path else f"would be created inside {str(existing)!r}, which is"
        raise RecipeError(f"--out {str(path)!r} {where} not writable; choose a folder you can write to, "
                          "e.g. --out runs/my_study.")


def _is_temporary(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


# Version of the results.json layout (docs/reference.md, "results.json"; typed layout: `headprobe.record.results`);
# `read_results` refuses an older one or none.
SCHEMA_VERSION = record.SCHEMA_VERSION


def new_results(recipe: dict) -> record.RunRecord:
    """The record of a run that has just started: every key of `record.ALWAYS`, status "running"."""
    return record.RunRecord(headprobe_version=__version__, schema_version=SCHEMA_VERSION, status="running",
                            recipe=recipe, backbone={}, data={}, taps={}, heads={}, buffer={}, protocol={}, timing={},
                            environment={})


class RunDir:
    """One run's folder. Only the main process writes; the others get a read-only handle."""

    def __init__(self, path: str | Path, writable: bool = True) -> None:
        self.path = Path(path)
        self.writable = writable
        # Called with every record `log_metrics` writes (the experiment trackers: `report.trackers`).
        self.sinks: list = []

    @classmethod
    def create(cls, path: str | Path, writable: bool = True) -> RunDir:
        run = cls(path, writable)
        if writable:
            (run.path / "plots").mkdir(parents=True, exist_ok=True)
            (run.path / "checkpoints").mkdir(exist_ok=True)
        return run

    @property
    def results_path(self) -> Path:
        return self.path / "results.json"

    def write_config(self, text: str) -> None:
        if self.writable:
            atomic_write_text(self.path / "config.yaml", text)

    def write_results(self, results: dict) -> None:
        """Rewrite results.json atomically, and results.csv from it (`record.tidy`: one row per metric). When that
        fails (a full disk) during a run, one more try records the failure in the smaller compact form, so the folder
        does not say "running" forever; the error is raised."""
        if not self.writable:
            return
        from headprobe.record.tidy import results_csv

        try:
            plain = _jsonable(results)
            atomic_write_text(self.results_path, json.dumps(plain, indent=2) + "\n")
            atomic_write_text(self.path / "results.csv", results_csv(plain))
        except OSError as err:
            if results.get("status") == "running":
                failed = {**results, "status": "failed",
                          "error": {"stage": "writing results.json", "message": f"{type(err).__name__}: {err}"}}
                with contextlib.suppress(OSError):
                    atomic_write_text(self.results_path, json.dumps(_jsonable(failed), separators=(",", ":")))
            raise

    def mark_stopped(self, status: str, error: dict) -> None:
        """The results last written, with `status` and `error`: what a process records when it is not the main
        process and the main one was lost.
        Nothing when there are none (or they cannot be read)."""
        try:
            last = read_results(self.path)
        except (FileNotFoundError, ValueError):
            return
        atomic_write_text(self.results_path, json.dumps(_jsonable({**last, "status": status, "error": error}),
                                                        indent=2) + "\n")

    def log_metrics(self, record: dict) -> None:
        if self.writable:
            with open(self.path / "metrics.jsonl", "a") as f:
                f.write(json.dumps(_jsonable({"time": round(time.time(), 3), **record})) + "\n")
            for sink in self.sinks:
                sink(_jsonable(record))

    def read_results(self) -> dict:
        return read_results(self.path)


def read_results(run_dir: str | Path) -> record.RunRecord:
    """A run's results.json, checked to have the shape every reader relies on (a mapping; `taps` a mapping of
    taps, each with a `metrics` mapping) and the current `schema_version`; ValueError with a sentence otherwise."""
    path = Path(run_dir) / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; pass a run directory written by `headprobe run`.")
    try:
        results = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text (byte {err.start}); it is not a results.json written by "
                         "headprobe, or the disk corrupted it.") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); was the run interrupted while writing?") from None
    except OSError as err:
        raise ValueError(f"{path} cannot be read ({err.strerror or err}).") from None
    record.check_record(results, str(path))
    record.check_version(results, str(path))
    return results


def metrics_from_json(taps: dict) -> dict:
    """`taps` as read from results.json with the NaN metrics that JSON stored as null restored to NaN (a resumed
    run computes with them as the run that measured them did)."""
    return {name: {**tap, "metrics": {m: math.nan if v is None else v for m, v in tap.get("metrics", {}).items()}}
            for name, tap in taps.items()}
