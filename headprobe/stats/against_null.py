"""A head's change read against a null head's: Δ(head) − Δ(null) = head − null, paired seed by seed and image by
image, with the interval that includes retraining (`stats.retraining.change_interval`).

Both taps are scored on the same test images; with several seeds each seed's null is that seed's own (an init copy
is the head at the weights that seed started from), so the per-seed difference head_s − null_s is the unit that is
retrained. The interval is `change_interval`'s — the hierarchical bootstrap (seeds drawn with replacement, one
image resample shared by every seed) or the t interval over the per-seed differences, the wider — with each
seed's null as that seed's reference: the same rule, and the same code, as head − backbone (or head − a backbone
tuned per seed).

>>> import torch
>>> from headprobe.stats.bootstrap import PerUnit
>>> a = PerUnit(torch.tensor([1.0, 1.0, 0.0, 1.0]), "test images")
>>> b = PerUnit(torch.tensor([1.0, 0.0, 0.0, 1.0]), "test images")
>>> Difference(a, b).value()
0.25
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from headprobe.stats.bootstrap import Resamples
    from headprobe.stats.measures import TapMeasures
    from headprobe.stats.retraining import Change


class Difference:
    """The statistic a − b of two taps' statistics over the same units, recomputed on each resample: its replicates
    are a's minus b's on the same resamples (each read once through `Resamples.replicates_of`)."""

    def __init__(self, a, b) -> None:
        if a.unit != b.unit:
            raise ValueError(f"a difference pairs statistics over the same units, got {a.unit!r} and {b.unit!r}.")
        self.a, self.b, self.unit = a, b, a.unit
        self.reflect = bool(getattr(a, "reflect", False) or getattr(b, "reflect", False))

    def value(self) -> float:
        return self.a.value() - self.b.value()

    def replicates(self, resamples) -> torch.Tensor:
        return resamples.replicates_of(self.a) - resamples.replicates_of(self.b)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _per_seed(taps: Mapping[str, TapMeasures], tap: str, metric: str) -> tuple[dict, dict]:
    """({seed: value}, {seed: per-unit statistic or None}) of `metric` at `tap`; a tap probed once has seed None."""
    measured = taps[tap]
    seeds = measured.seeds
    if len(seeds) > 1:
        return ({s: seeds[s].metrics.get(metric) for s in seeds}, {s: seeds[s].per_unit.get(metric) for s in seeds})
    return {None: measured.metrics.get(metric)}, {None: measured.per_unit.get(metric)}


def change_against(taps: Mapping[str, TapMeasures], resamples: Mapping[str, Resamples], tap: str, null_tap: str,
                   metric: str, seed: int = 0) -> Change | None:
    """`retraining.Change` of `metric` from the null head's tap to the head's, seed by seed (record fields: `head`
    the head's seed mean, `null` the null's, `change` their difference); None where either lacks the metric or
    their seeds differ. taps: {tap: TapMeasures} (`stats.measures`)."""
    from headprobe.stats.retraining import change_interval

    if tap not in taps or null_tap not in taps:
        return None
    head_values, head_stats = _per_seed(taps, tap, metric)
    null_values, null_stats = _per_seed(taps, null_tap, metric)
    if set(head_values) != set(null_values) or not all(_finite(v) for v in [*head_values.values(),
                                                                              *null_values.values()]):
        return None
    seeds = list(head_values)
    stats = [head_stats[s] for s in seeds], [null_stats[s] for s in seeds]
    paired = all(x is not None for x in stats[0] + stats[1]) and len({x.unit for x in stats[0] + stats[1]}) == 1
    # One reference per seed: `change_interval` pairs each seed's head with that seed's null (as it pairs a tuned
    # backbone's heads with it), on the image resamples every tap shares.
    return change_interval([null_values[s] for s in seeds] if len(seeds) > 1 else null_values[seeds[0]],
                           [head_values[s] for s in seeds],
                           (stats[1] if len(seeds) > 1 else stats[1][0]) if paired else None,
                           stats[0] if paired else None, resamples, seed, reference="its null of the same seed")


def null_record(change, null: str, null_tap: str) -> dict:
    """The JSON record of a change against a null: the change's own record with `null` (the head's name) and its
    value under `null_value` instead of `backbone`."""
    out = change.record()
    out["null_value"] = out.pop("backbone")
    return {"null": null, "tap": null_tap, **out}
