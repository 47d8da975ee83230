"""The run directory: ``config.yaml``, ``results.json``, ``metrics.jsonl``, ``plots/``, ``checkpoints/``.

`results.json` is rewritten atomically (temporary file + rename) after every
finished stage, so a run that fails keeps everything it had computed.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from . import __version__


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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


def new_results(recipe: dict) -> dict:
    return {
        "headprobe_version": __version__,
        "status": "running",
        "recipe": recipe,
        "backbone": {},
        "data": {},
        "taps": {},
        "heads": {},
        "buffer": {},
        "protocol": {},
        "timing": {},
        "environment": {},
    }


class RunDir:
    """One run's folder. Only the main process writes; the others get a read-only handle."""

    def __init__(self, path: str | Path, writable: bool = True) -> None:
        self.path = Path(path)
        self.writable = writable

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
        if self.writable:
            atomic_write_text(self.results_path, json.dumps(_jsonable(results), indent=2) + "\n")

    def log_metrics(self, record: dict) -> None:
        if self.writable:
            with open(self.path / "metrics.jsonl", "a") as f:
                f.write(json.dumps(_jsonable({"time": round(time.time(), 3), **record})) + "\n")

    def read_results(self) -> dict:
        return read_results(self.path)


def read_results(run_dir: str | Path) -> dict:
    path = Path(run_dir) / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; pass a run directory written by `headprobe run`.")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); was the run interrupted while writing?") from None
