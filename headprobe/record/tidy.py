"""Tidy tables of a run's numbers: one row per (tap, metric[, seed]), one `pandas.read_csv` away.

``results.csv`` (written next to ``results.json`` whenever that is written) and the long-format ``compare.csv``
(the same columns after a ``run`` column) hold exactly the numbers of ``results.json``:

- ``tap, head, depth``: the tap (`backbone`, `HEAD@i`, `HEAD`), its head (empty for the backbone) and depth;
- ``metric, value``: the metric's value (empty where it was not finite);
- ``low, high``: the ends of its 95% interval (``uncertainty[metric]["ci95"]``; empty where it has none);
- ``seed``: empty for a tap's own value (with several seeds: their mean), else the seed of one retrained head
  (``taps[T]["seeds"][S]``; these rows have no interval of their own).

>>> import pandas as pd  # doctest: +SKIP
>>> table = pd.read_csv("runs/quickstart/results.csv")  # doctest: +SKIP
>>> table[(table.metric == "linear.acc") & table.seed.isna()]  # doctest: +SKIP
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator, Mapping
from typing import Any

TIDY_COLUMNS = ("tap", "head", "depth", "metric", "value", "low", "high", "seed")


def _number(value: Any) -> float | None:
    """A finite number, else None (JSON's null for NaN, a missing value)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def tidy_rows(results: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """One dict per (tap, metric) and per (tap, metric, seed) of `results` (a results.json record), in the order
    results.json holds them: each tap's own metrics first, then its seeds'."""
    for tap_name, tap in (results.get("taps") or {}).items():
        where = {"tap": tap_name, "head": tap.get("head"), "depth": tap.get("depth")}
        uncertainty = tap.get("uncertainty") or {}
        for metric, value in (tap.get("metrics") or {}).items():
            ci = (uncertainty.get(metric) or {}).get("ci95")
            low, high = ci if isinstance(ci, list) and len(ci) == 2 else (None, None)
            yield {**where, "metric": metric, "value": _number(value), "low": _number(low), "high": _number(high),
                   "seed": None}
        for seed, record in (tap.get("seeds") or {}).items():
            for metric, value in (record.get("metrics") or {}).items():
                yield {**where, "metric": metric, "value": _number(value), "low": None, "high": None, "seed": seed}


def _csv(header: tuple[str, ...], rows: Iterator[dict[str, Any]]) -> str:
    """CSV text with `header`; None is an empty cell, floats keep every digit (`repr`)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        writer.writerow(["" if row[key] is None else row[key] for key in header])
    return out.getvalue()


def results_csv(results: Mapping[str, Any]) -> str:
    """results.csv: `TIDY_COLUMNS`, one row per metric (see the module docstring)."""
    return _csv(TIDY_COLUMNS, tidy_rows(results))


def compare_long_csv(runs: Mapping[str, Mapping[str, Any]]) -> str:
    """compare.csv: ``run`` (each run's label) and then `TIDY_COLUMNS`, every run's rows one after the other."""
    rows = ({"run": label, **row} for label, results in runs.items() for row in tidy_rows(results))
    return _csv(("run", *TIDY_COLUMNS), rows)
