"""The report's "Metrics at every tap" section: every metric at every tap, grouped by head, with each value's 95%
half-interval and its difference from the backbone, coloured by its direction (higher / lower) with ✓ / ✗ where
the buffer claim predicts a direction (for / against it).

Protocol values (`linear.C`, ...) go to a table of their own, the per-parameter `aug_r2.*` rows fold under
`aug_r2.mean`, and the whole table folds under a summary line: the page opens with the answers, not 45 rows.
"""

from __future__ import annotations

from markupsafe import Markup

from .glossary import is_protocol_value, tooltip
from .markup import fmt, render
from .plots import Plot, metric_names
from .table import half_width

__all__ = ["metric_label", "metrics_section", "tap_columns"]


def tap_kind(name: str, tap: dict) -> str:
    """"bb" before the head, "out" at a head's output, "hidden" at one of its hidden layers."""
    if tap.get("head") is None:
        return "bb"
    return "out" if name == tap["head"] else "hidden"


def tap_label(name: str, tap: dict) -> str:
    if tap.get("head") is None:
        return "backbone"
    return "output" if name == tap["head"] else f"layer {tap.get('depth', '?')}"


def tap_columns(taps: dict) -> tuple[list[dict], list[dict]]:
    """(groups, columns): one group per head (and "before the head") spanning its taps, one column per tap, in
    group order: {"name", "kind", "label"}."""
    groups: dict[str, list[str]] = {}
    for name, tap in taps.items():
        groups.setdefault(tap.get("head") or "backbone", []).append(name)
    from headprobe.stats.answer_text import head_phrase

    top = [{"label": "before the head" if g == "backbone" else head_phrase(g), "span": len(names),
            "cls": "bb" if g == "backbone" else ""} for g, names in groups.items()]
    columns = [{"name": t, "kind": tap_kind(t, taps[t]), "label": tap_label(t, taps[t])}
               for names in groups.values() for t in names]
    return top, columns


def metric_label(metric: str, results: dict) -> dict:
    """The metric's name, its glossary tooltip, and for accuracies how many test units they are over."""
    data = results.get("data", {})
    label = {"name": metric, "tooltip": tooltip(metric, data.get("n_classes")), "n": None}
    if metric.endswith(".acc"):
        record = (results.get("taps", {}).get("backbone", {}).get("uncertainty") or {}).get(metric) or {}
        n, unit = record.get("n_units") or data.get("n_test"), record.get("unit") or "test images"
        if n is not None:
            label["n"] = f"n = {fmt(n)} {unit}"
    return label


def delta(metric: str, value, base) -> dict | None:
    """The difference from the backbone {"text", "cls", "mark", "title"}: cls "rise"/"fall", the direction of the
    change itself (as the heat-map colours it); mark "✓"/"✗" where the buffer claim predicts a direction for `metric`
    (`headprobe.stats.verdict.predicted_change`) and the change goes that way / the other way, "" where it predicts
    nothing; None without both numbers."""
    numbers = [v for v in (value, base) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(numbers) < 2:
        return None
    diff = value - base
    if diff == 0:
        return {"text": "±0", "cls": "", "mark": "", "title": ""}
    from headprobe.stats.verdict import predicted_change

    sign = predicted_change(metric)
    if metric == "mi.infonce" and min(value, base) <= 0:
        sign = None  # a bound ≤ 0 at either tap: the critic is uninformative, the change is not evidence
    mark = "" if sign is None else "✓" if sign * diff > 0 else "✗"
    title = {"✓": "the way the buffer claim predicts", "✗": "against the buffer claim's prediction", "": ""}[mark]
    return {"text": f"{'+' if diff > 0 else ''}{fmt(float(diff))}", "cls": "rise" if diff > 0 else "fall",
            "mark": mark, "title": title}


def _cell(metric: str, value, tap: dict, kind: str, base) -> dict:
    half = half_width(tap, metric)
    return {"kind": kind, "value": fmt(value), "ci": None if half is None else f"±{fmt(float(half))}",
            "delta": delta(metric, value, base) if kind != "bb" else None,
            "uninformative": metric == "mi.infonce" and isinstance(value, (int, float)) and value <= 0}


def metrics_section(results: dict, plots: list[Plot]) -> Markup:
    taps = results.get("taps", {})
    top, columns = tap_columns(taps)
    base = taps.get("backbone", {}).get("metrics", {})
    names = metric_names(taps)

    def row(metric: str) -> dict:
        return {"label": metric_label(metric, results),
                "cells": [_cell(metric, taps[c["name"]].get("metrics", {}).get(metric), taps[c["name"]], c["kind"],
                                base.get(metric)) for c in columns]}

    # The per-parameter augmentation R² rows (13 for simclr) fold under their mean.
    per_parameter = [m for m in names if m.startswith("aug_r2.") and m != "aug_r2.mean" and not is_protocol_value(m)]
    knobs = [m for m in names if is_protocol_value(m)]
    protocol = [{"label": metric_label(m, results),
                 "cells": [{"kind": c["kind"], "value": fmt(taps[c["name"]].get("metrics", {}).get(m))}
                           for c in columns]} for m in knobs]
    return render("sections/metrics.html.j2", taps=taps, top=top, columns=columns,
                  rows=[row(m) for m in names if not is_protocol_value(m) and m not in per_parameter],
                  per_parameter=[row(m) for m in per_parameter], protocol=protocol, plots=plots)
