"""The report's heat-map: every metric at every tap, coloured by the direction of its change from the backbone
(`direction_change`: rise or fall, measured against the change's own 95% interval), each cell marked ✓ where the
change goes the way the buffer claim predicts by more than that interval and ✗ where it goes against it
(`claim_change`). Colour and mark are apart so that a k-NN accuracy that rose reads as a rise, whatever the claim.

A percentage of the backbone's value swings wildly for a metric near zero (0.0093 → 0.00045 reads −95%), so the
colour is the head-tap − backbone difference divided by the half-width of its 95% interval: the buffer evidence's
interval of the margin where the verdict recorded one (the head's output tap, paired bootstrap), else
√(h_tap² + h_backbone²) from each tap's own interval (taps[T]["uncertainty"][M]["ci95"]). Without any interval the
colour is the difference itself in the metric's units (and the cell has no mark). The mark reads the same change
signed by `stats.verdict.predicted_change`; metrics the claim makes no prediction for (descriptions such as raw
`align`) have none, and protocol values (`linear.C`) are left out. `mi.infonce` is grey wherever either tap's bound
is ≤ 0 (the critic is uninformative there, as the verdict treats it).
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np

from .canvas import new_figure, save
from .glossary import is_protocol_value

# Colour saturates at this many interval half-widths (or units of the metric where it has no interval).
SATURATION = 3.0


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def _half(record) -> float | None:
    """Half-width of an interval [lo, hi] around `value` (the larger half), from a record {"ci95": ...}."""
    ci = (record or {}).get("ci95")
    if not isinstance(ci, list) or len(ci) != 2 or None in ci:
        return None
    return (ci[1] - ci[0]) / 2


def _predicted(metric: str) -> int | None:
    from headprobe.stats.verdict import (
        predicted_change,  # the verdict's rule: one place says which way the claim points
    )

    return predicted_change(metric)


def heatmap_metrics(taps: dict) -> list[str]:
    """Every measured metric of the run, first seen first; protocol values (`linear.C`, ...) are left out."""
    names: list[str] = []
    for tap in taps.values():
        names += [m for m in tap.get("metrics", {}) if m not in names and not is_protocol_value(m)]
    return names


def claim_change(results: dict) -> tuple[list[str], list[str], np.ndarray, np.ndarray, np.ndarray]:
    """(metrics, taps, values, change, scaled): values (M, T) at each tap (NaN if not measured); change (M, T) the
    signed difference predicted·(v − v_backbone), positive where it goes the claim's way (NaN for the backbone column
    and for metrics the claim makes no prediction for); scaled (M, T) True where change was divided by the
    half-width of its 95% interval, False where it is in the metric's own units."""
    return _changes(results, by_claim=True)


def direction_change(results: dict) -> tuple[list[str], list[str], np.ndarray, np.ndarray, np.ndarray]:
    """As `claim_change`, with change (M, T) = (v − v_backbone) for every metric, the claim's prediction or none:
    positive where the value rose."""
    return _changes(results, by_claim=False)


def _changes(results: dict, by_claim: bool) -> tuple[list[str], list[str], np.ndarray, np.ndarray, np.ndarray]:
    taps = results["taps"]
    names, metrics = list(taps), heatmap_metrics(taps)
    values = np.array([[_number(taps[t].get("metrics", {}).get(m)) for t in names] for m in metrics],
                      dtype=float).reshape(len(metrics), len(names))
    change = np.full_like(values, np.nan)
    scaled = np.zeros(values.shape, dtype=bool)
    if "backbone" not in names:
        return metrics, names, values, change, scaled
    base_tap = taps["backbone"]
    buffer = results.get("buffer") or {}
    for i, metric in enumerate(metrics):
        sign = _predicted(metric) if by_claim else 1
        if sign is None:
            continue
        base = values[i, names.index("backbone")]
        h_base = _half((base_tap.get("uncertainty") or {}).get(metric))
        for j, name in enumerate(names):
            if name == "backbone" or not (math.isfinite(values[i, j]) and math.isfinite(base)):
                continue
            if metric == "mi.infonce" and min(values[i, j], base) <= 0:
                continue  # a bound ≤ 0: the critic does no better than chance there ("critic uninformative")
            diff = sign * (values[i, j] - base)
            evidence = ((buffer.get(name) or {}).get("evidence") or {}).get(metric)
            half = _half(evidence) if isinstance(evidence, dict) and name == taps[name].get("head") else None
            if half is None:
                h_tap = _half((taps[name].get("uncertainty") or {}).get(metric))
                half = math.hypot(h_tap, h_base) if h_tap is not None and h_base is not None else None
            if half is not None and half > 0:
                change[i, j], scaled[i, j] = diff / half, True
            else:
                change[i, j] = diff
    return metrics, names, values, change, scaled


def wrap_to(text: str, inches: float, points: float) -> str:
    """`text` broken into lines about `inches` long at a font of `points` (a character is about 0.6 em wide), so a
    title or colour-bar label stays inside a small figure instead of running past its edge."""
    return "\n".join(textwrap.wrap(text, max(12, int(inches * 72 / (0.6 * points)))))


def _short(value: float) -> str:
    return f"{value:.3g}" if abs(value) >= 1000 or (value != 0 and abs(value) < 0.01) else f"{value:.3f}"


def plot_tap_heatmap(results: dict, path: Path) -> Path:
    """`tap_heatmap` saved to `path`."""
    return save(tap_heatmap(results), path)


def claim_marks(results: dict) -> np.ndarray:
    """(M, T) "✓" where `claim_change` is at least one 95% half-interval the way the claim predicts, "✗" at least
    one against it, "" otherwise (no prediction, no interval, or within the interval)."""
    _, _, _, change, scaled = claim_change(results)
    marks = np.full(change.shape, "", dtype=object)
    marks[scaled & (change >= 1)] = "✓"
    marks[scaled & (change <= -1)] = "✗"
    return marks


def tap_heatmap(results: dict):
    """Metric × tap: the number is the measured value, the colour `direction_change` (orange: higher than at the
    backbone, purple: lower, grey: the backbone itself or not measured), the mark `claim_marks` (✓ as the buffer
    claim predicts, ✗ against it); rows coloured in the metric's units are marked "(Δ units)". The title and the
    colour bar's label are wrapped to the figure's size (constrained layout keeps them inside)."""
    from matplotlib import colormaps

    metrics, names, values, change, scaled = direction_change(results)
    if not metrics:
        raise ValueError("no metrics to plot")
    marks = claim_marks(results)
    cmap = colormaps["PuOr_r"].with_extremes(bad="#e6e6e6")
    width, height = max(5.0, 1.1 * len(names) + 3.0), max(3.2, 0.42 * len(metrics) + 1.8)
    fig = new_figure(width, height)
    ax = fig.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(np.clip(change, -SATURATION, SATURATION)), cmap=cmap,
                      vmin=-SATURATION, vmax=SATURATION, aspect="auto")
    labels = []
    for i, metric in enumerate(metrics):
        in_units = np.isfinite(change[i]).any() and not scaled[i][np.isfinite(change[i])].all()
        labels.append(f"{metric} (Δ units)" if in_units else metric)
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right")
    ax.set_yticks(range(len(metrics)), labels)
    for i in range(len(metrics)):
        for j in range(len(names)):
            if math.isfinite(values[i, j]):
                strong = math.isfinite(change[i, j]) and abs(change[i, j]) > 0.7 * SATURATION
                text = _short(values[i, j]) + (f" {marks[i, j]}" if marks[i, j] else "")
                ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if strong else "black")
    label = (f"change vs backbone ÷ its 95% half-interval: orange higher, purple lower (±{SATURATION:g} "
             "saturates)")
    fig.colorbar(image, ax=ax, shrink=0.9, label=wrap_to(label, height - 1.0, 10))
    fig.suptitle(wrap_to("Every metric at every tap (numbers: measured value; ✓ / ✗: beyond its 95% interval "
                         "for / against the buffer claim)", 0.9 * width, 12))
    return fig
