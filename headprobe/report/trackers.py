"""Experiment trackers: ``report_to: [tensorboard, wandb, mlflow]`` sends a run to them through Accelerate's tracker
classes (the names are Accelerate's ``log_with`` names), next to ``metrics.jsonl``.

What each receives:

- the resolved recipe as the run's configuration (dotted keys: ``train.lr``);
- training curves: every ``"stage": "train"`` and ``"geometry"`` record of metrics.jsonl, as
  ``train/HEAD/<field>`` (``train/HEAD/seed-S/<field>`` with several seeds) at the record's step;
- at the end (at the last training step), every tap's final metrics with their 95% intervals,
  ``taps/TAP/<metric>``, ``.../<metric>/low`` and ``.../<metric>/high`` (a hidden layer ``HEAD@i`` is
  ``HEAD/layer<i>``); each head's verdict as text
  ``buffer/HEAD`` with its ``support``/``against``/``unresolved`` counts; and the numbers and texts of
  ``results["claims"]`` where the run has them (``claims/<path>``).

TensorBoard writes into ``RUN/tensorboard/``; W&B's project is the recipe's name and its run the run folder's name
(``WANDB_MODE=offline`` keeps it on disk under ``RUN/wandb/``); MLflow's experiment is the recipe's name, stored
where ``MLFLOW_TRACKING_URI`` says, with the interval ends as ``<metric>.low`` / ``.high`` and the texts as run tags
(`mlflow_values`). The packages are optional: a recipe naming one that is not installed is refused
before anything runs (`recipe.trackers.missing_packages`). A tracker is a copy of the run's record: each call to it
waits at most ``runtime.tracker_timeout_s`` seconds, and one that fails or does not answer is dropped with one
warning while the run goes on.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from headprobe.parallel.bounded import BoundedWorker
from headprobe.recipe import RuntimeSpec

# Fields of a metrics.jsonl record that say where it belongs rather than what was measured.
_PLACE = {"stage", "head", "step", "epoch", "time", "seed", "tap", "probe", "process"}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _flat(prefix: str, value: Any, out: dict[str, Any], keep_text: bool) -> dict[str, Any]:
    """Numeric (and, with keep_text, text) leaves of nested mappings as {"prefix/a/b": value}."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            _flat(f"{prefix}/{key}", item, out, keep_text)
    elif (number := _number(value)) is not None:
        out[prefix] = number
    elif keep_text and isinstance(value, str):
        out[prefix] = value
    return out


def _config(recipe: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The recipe as {dotted key: bool | int | float | str} (lists and null as text): what every tracker takes."""
    out: dict[str, Any] = {}
    for key, value in recipe.items():
        if isinstance(value, Mapping) and value:
            out |= _config(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return out


def tap_key(tap: str) -> str:
    """``mlp@1`` → ``mlp/layer1`` (names some trackers accept), ``mlp`` and ``backbone`` unchanged."""
    head, sep, depth = tap.partition("@")
    return f"{head}/layer{depth}" if sep else tap


def final_values(results: Mapping[str, Any]) -> dict[str, Any]:
    """What the end of a run sends: taps' metrics with interval ends, verdicts, claims (see the module docstring)."""
    out: dict[str, Any] = {}
    for tap, entry in (results.get("taps") or {}).items():
        key = f"taps/{tap_key(tap)}"
        for metric, value in (entry.get("metrics") or {}).items():
            if (number := _number(value)) is None:
                continue
            out[f"{key}/{metric}"] = number
            ci = ((entry.get("uncertainty") or {}).get(metric) or {}).get("ci95")
            if isinstance(ci, list) and len(ci) == 2 and None not in ci:
                out[f"{key}/{metric}/low"], out[f"{key}/{metric}/high"] = float(ci[0]), float(ci[1])
    for head, verdict in (results.get("buffer") or {}).items():
        out[f"buffer/{head}"] = str(verdict.get("verdict"))
        out |= {f"buffer/{head}/{k}": float(verdict[k]) for k in ("support", "against", "unresolved") if k in verdict}
    if results.get("claims"):
        _flat("claims", results["claims"], out, keep_text=True)
    return out


def curve_values(record: Mapping[str, Any]) -> tuple[dict[str, float], int] | None:
    """({key: value}, step) of a training or geometry record of metrics.jsonl, or None for any other record."""
    if record.get("stage") not in ("train", "geometry") or "step" not in record:
        return None
    seed = f"/seed-{record['seed']}" if "seed" in record else ""
    prefix = f"{record['stage']}/{record.get('head', 'all')}{seed}"
    values = _flat(prefix, {k: v for k, v in record.items() if k not in _PLACE}, {}, keep_text=False)
    return values, int(record["step"])


def mlflow_values(values: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, str]]:
    """(metrics, tags) for MLflow: its metrics take numbers only, so the texts (verdicts, answers) go as run tags; an
    interval's ends are ``<metric>.low`` / ``.high``, since MLflow's file store keeps each metric in a file of that
    name and ``<metric>/low`` would need the file to be a folder too."""
    numbers, texts = {}, {}
    for key, value in values.items():
        if isinstance(value, str):
            texts[key] = value
        else:
            stem, sep, end = key.rpartition("/")
            numbers[f"{stem}.{end}" if sep and end in ("low", "high") and stem in values else key] = value
    return numbers, texts


class Trackers:
    """Accelerate trackers of one run; `log_record` takes metrics.jsonl records, `log_results` the final record.

    Each tracker's calls run on a thread of its own, each waited for at most `timeout_s` (`parallel.bounded`); a
    tracker that fails or does not answer is dropped with one warning, and the run goes on: its results on disk are
    the product, a tracker holds a copy."""

    def __init__(self, trackers: list, timeout_s: float = RuntimeSpec.tracker_timeout_s) -> None:
        self.timeout_s = timeout_s
        self.last_step = 0
        self._running = [(tracker, BoundedWorker(timeout_s, f"headprobe-{tracker.name}")) for tracker in trackers]

    @property
    def trackers(self) -> list:
        return [tracker for tracker, _ in self._running]

    def start(self, name: str, recipe: Mapping[str, Any], run_path) -> None:
        """Start the tracker `name` on a thread of its own (a failure: one warning, and the run goes without it)."""
        worker = BoundedWorker(self.timeout_s, f"headprobe-{name}")
        try:
            tracker = worker.call(lambda: _start(name, recipe, run_path), "starting the run")
        except Exception as err:
            worker.stop()
            _warn(name, "starting the run", err)
            return
        self._running.append((tracker, worker))

    def _send(self, what: str, call) -> None:
        """call(tracker) for every tracker still running, each on its own thread; one that fails is dropped."""
        for tracker, worker in list(self._running):
            try:
                worker.call(lambda tracker=tracker: call(tracker), what)
            except Exception as err:
                self._running.remove((tracker, worker))
                worker.stop()
                _warn(tracker.name, what, err)

    def log_record(self, record: dict) -> None:
        curve = curve_values(record)
        if curve is not None and curve[0]:
            self.last_step = max(self.last_step, curve[1])
            self._send("logging a training curve", lambda tracker: tracker.log(curve[0], step=curve[1]))

    def log_results(self, results: Mapping[str, Any]) -> None:
        """The final values at the last training step: W&B drops anything logged at a step before its last one."""
        values = final_values(results)

        def send(tracker) -> None:
            if tracker.name == "mlflow":
                numbers, texts = mlflow_values(values)
                tracker.log(numbers, step=self.last_step)
                import mlflow

                mlflow.set_tags(texts)
            else:
                tracker.log(values, step=self.last_step)

        self._send("logging the final metrics", send)

    def close(self) -> None:
        self._send("finishing the run", lambda tracker: tracker.finish())
        for _, worker in self._running:
            worker.stop()
        self._running = []


def _warn(name: str, what: str, err: Exception) -> None:
    reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
    warnings.warn(f"report_to: {name} failed while {what} ({type(err).__name__}: {reason}); nothing more is sent to "
                  "it, and the run goes on (its results are on disk as always).", stacklevel=3)


def _start(name: str, recipe: Mapping[str, Any], run_path) -> Any:
    from accelerate import PartialState
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    PartialState()  # Accelerate's trackers log through its process state (a run has made it; a caller may not)
    cls = LOGGER_TYPE_TO_CLASS[name]
    if name == "tensorboard":
        tracker = cls("tensorboard", run_path)
    elif name == "wandb":
        tracker = cls(recipe.get("name", "headprobe"), name=run_path.name, dir=str(run_path))
    else:
        tracker = cls(experiment_name=recipe.get("name", "headprobe"), run_name=run_path.name)
    tracker.start()
    tracker.store_init_configuration(_config(recipe))
    return tracker


@contextmanager
def tracking(recipe, run_dir) -> Iterator[Trackers]:
    """The trackers `recipe.report_to` names, started for `run_dir` (main process only: the one that writes) and
    fed its metrics.jsonl records while the block runs; finished when it ends, however it ends. Each call waits at
    most ``recipe.runtime.tracker_timeout_s`` seconds (recorded with the recipe)."""
    names = list(getattr(recipe, "report_to", None) or [])
    if not names or not run_dir.writable:
        yield Trackers([])
        return
    plain = recipe.to_dict()
    trackers = Trackers([], timeout_s=recipe.runtime.tracker_timeout_s)
    try:
        for name in names:
            trackers.start(name, plain, run_dir.path)
        run_dir.sinks.append(trackers.log_record)
        yield trackers
    finally:
        if trackers.log_record in run_dir.sinks:
            run_dir.sinks.remove(trackers.log_record)
        trackers.close()
