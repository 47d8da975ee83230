"""What the statistics read of a run: each tap's measurements, typed (#37).

The buffer verdict (`stats.verdict`), the paper's questions (`stats.claims`) and a head's change against its null
(`stats.against_null`) take {tap: `TapMeasures`}, never results.json's dicts: in a run the record's writer hands
them over (`RecordWriter.measures`), and for a finished run `tap_measures` reads them from results.json["taps"]
and the per-unit stores (`stats.bootstrap.load_per_unit`).

>>> import torch
>>> from headprobe.stats.bootstrap import PerUnit
>>> taps = {"backbone": {"head": None, "depth": 0, "metrics": {"linear.acc": 0.75}},
...         "h": {"head": "h", "depth": 2, "metrics": {"linear.acc": 0.5},
...               "seeds": {"0": {"metrics": {"linear.acc": 0.5}}}}}
>>> per_unit = {"backbone": {"linear.acc": PerUnit(torch.tensor([1.0, 1.0, 1.0, 0.0]), "test images")}}
>>> measured = tap_measures(taps, per_unit)
>>> measured["h"].head, measured["h"].seeds["0"].metrics, measured["backbone"].per_unit["linear.acc"].value()
('h', {'linear.acc': 0.5}, 0.75)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# A metric's value as a probe reports it (None or NaN where it could not be computed).
Value = float | None


@dataclass(frozen=True)
class Measures:
    """One probed unit's measurements (a tap, or one seed of it): metrics {name: value}, the per-unit statistics
    of those that have them ({name: `bootstrap.PerUnit` or a statistic recomputed per resample}) and each probe's
    protocol ({probe: its settings and splits})."""

    metrics: Mapping[str, Value]
    per_unit: Mapping[str, Any] = field(default_factory=dict)
    protocol: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TapMeasures(Measures):
    """One tap's measurements: its metrics and per-unit statistics (with several seeds, the seeds' means), each
    seed's own (`seeds`, keyed by the seed as results.json writes it: "0") and the head it belongs to (None for the
    backbone)."""

    seeds: Mapping[str, Measures] = field(default_factory=dict)
    head: str | None = None


def seed_unit(tap: str, seed: str | int) -> str:
    """The per-unit store's name of one seed of a tap ("h.seed-0"), as `record.writer.unit_key` names it."""
    return f"{tap}.seed-{seed}"


def tap_measures(taps: Mapping[str, Mapping], per_unit: Mapping[str, Mapping[str, Any]] | None = None
                 ) -> dict[str, TapMeasures]:
    """{tap: TapMeasures} from a record's taps (results.json["taps"]) and the per-unit statistics by unit
    ({"TAP" | "TAP.seed-S": {metric: statistic}}, the per-unit stores' names); the one reader the statistics'
    callers use for a finished run."""
    per_unit = per_unit or {}
    return {name: TapMeasures(metrics=dict(tap["metrics"]), per_unit=dict(per_unit.get(name, {})),
                              protocol=dict(tap.get("protocol", {})),
                              seeds={s: Measures(dict(record.get("metrics", {})),
                                                 dict(per_unit.get(seed_unit(name, s), {})),
                                                 dict(record.get("protocol", {})))
                                     for s, record in (tap.get("seeds") or {}).items()},
                              head=tap.get("head"))
            for name, tap in taps.items()}
