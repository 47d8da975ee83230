"""The collapse table of the report's Geometry section: claim 4, per head, from the run's tracked curvature.

"Collapse is unstable only for smooth heads" (PAPER.md claim 4): at a collapsed start a Swish/GELU head has
λ_min < 0 (a strict saddle), linear and ReLU heads do not. The paper counts λ_min < 0 in 72/100 epochs for a
Swish head started collapsed and 1/100 for a ReLU head. A negative λ_min can come from the loss, though:
SimSiam's ∇²_h L is indefinite, so its G-term J_hᵀ ∇²_h L J_h is negative for any head. `summarise_collapse`
counts, per head, the tracked points with λ_min < −max(error bound, round-off) and splits them by the record's
"curvature_source" (`geometry.tracking.curvature_snapshot(split=True)`): "loss" (the G-term alone is negative)
or "head" (it is not; the M-term made λ_min negative). Next to it: whether the head started collapsed by the
run's step-0 criterion (protocol.train.collapse_start) and whether its outputs escaped collapse (out_std of the
last training record above the same threshold).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from .markup import esc, table

PAPER = {"swish": "72/100 epochs (Swish, collapsed)", "silu": "72/100 epochs (Swish, collapsed)",
         "relu": "1/100 epochs (ReLU, collapsed)"}


def _paper(config: dict) -> str:
    if config.get("type") != "mlp":
        return ""
    return PAPER.get(str(config.get("act")), "")


def summarise_collapse(results: dict, records: Sequence[dict]) -> dict:
    """{head: summary} for every head with split curvature records (none: {}). A summary holds "n_points",
    "negative", "from_loss", "from_head" (counts), their fractions "negative_frac", "from_loss_frac",
    "from_head_frac", "m_norm_ratio_median", "loss_h_indefinite_frac", "collapsed_start" (bool or None when the
    run did not record it), "out_std_start", "threshold", "out_std_uniform", "out_std_end" (last training
    record), "escaped" (out_std_end > threshold; None when either is unknown), "paper"."""
    start = results.get("protocol", {}).get("train", {}).get("collapse_start") or {}
    out: dict = {}
    for name, head in results.get("heads", {}).items():
        points = [r for r in records if r.get("stage") == "geometry" and r.get("head") == name
                  and "curvature_source" in r]
        if not points:
            continue
        train = [r for r in records if r.get("stage") == "train" and r.get("head") == name
                 and isinstance(r.get("out_std"), (int, float)) and math.isfinite(r["out_std"])]
        n = len(points)
        counts = {src: sum(r["curvature_source"] == src for r in points) for src in ("loss", "head")}
        negative = counts["loss"] + counts["head"]
        begin = start.get(name, {})
        threshold = begin.get("threshold")
        end = train[-1]["out_std"] if train else None
        ratios = [r["m_norm_ratio"] for r in points if isinstance(r.get("m_norm_ratio"), (int, float))]
        out[name] = {
            "n_points": n, "negative": negative, "from_loss": counts["loss"], "from_head": counts["head"],
            "negative_frac": negative / n, "from_loss_frac": counts["loss"] / n, "from_head_frac": counts["head"] / n,
            "m_norm_ratio_median": statistics.median(ratios) if ratios else None,
            "loss_h_indefinite_frac": sum(bool(r.get("negative_loss_h")) for r in points) / n,
            "collapsed_start": begin.get("collapsed"), "out_std_start": begin.get("out_std"),
            "threshold": threshold, "out_std_uniform": begin.get("out_std_uniform", points[0].get("out_std_uniform")),
            "out_std_end": end,
            "escaped": None if end is None or threshold is None else bool(end > threshold),
            "paper": _paper(head.get("config", {})),
        }
    return out


def collapse_table(summary: dict) -> str:
    """The HTML table of `summarise_collapse`'s output; '' when the run tracked no split curvature."""
    if not summary:
        return ""
    rows = []
    for name, s in summary.items():
        rows.append([name, f"{s['negative']}/{s['n_points']}", s["negative_frac"], s["from_loss_frac"],
                     s["from_head_frac"], s["m_norm_ratio_median"], s["loss_h_indefinite_frac"], s["collapsed_start"],
                     s["out_std_start"], s["threshold"], s["out_std_end"], s["out_std_uniform"], s["escaped"],
                     s["paper"]])
    header = ["head", "λ_min < −bound", "fraction", "from the loss", "from the head", "median ‖M‖/‖H‖",
              "∇²_h L indefinite", "collapsed at step 0", "out_std step 0", "threshold", "out_std end", "1/√d",
              "escaped", "paper (λ_min < 0)"]
    legend = ("<p class='legend'>Per tracked point: λ_min of the loss Hessian w.r.t. the representation batch "
              "below −max(Lanczos error bound, round-off). “From the loss”: the G-term J_hᵀ∇²_hL J_h alone "
              "(predictor inside the loss) is negative too; “from the head”: it is not, so the M-term "
              "Σ_i[∇_hL]_i∇²_z h_i made it. Claim 4 is about the head column. Collapsed at step 0: out_std ≤ "
              "threshold; escaped: out_std of the last training record above it.</p>")
    return f"<h3>{esc('Collapse: where negative curvature comes from (claim 4)')}</h3>" + table(
        header, rows, numeric_from=1) + legend


def collapse_section(results: dict, records: Sequence[dict]) -> str:
    """`collapse_table` of `summarise_collapse`: the hook `report.html` calls from its Geometry section."""
    return collapse_table(summarise_collapse(results, records))

