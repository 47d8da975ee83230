"""The collapse table of the report's Geometry section: claim 4, per head, from the run's tracked curvature.

"Collapse is unstable only for smooth heads" (the paper, claim 4): at a collapsed start a Swish/GELU head has
λ_min < 0 (a strict saddle), linear and ReLU heads do not. The paper counts λ_min < 0 in 72/100 epochs for a
Swish head started collapsed and 1/100 for a ReLU head. Only points taken while the head is still collapsed bear on
that: `summarise_collapse` counts, per head, the tracked points whose state is collapsed by the recorded criterion
(the record's "collapsed": out_std ≤ threshold/√out), and among them those with λ_min < −max(error bound,
round-off), split by the record's "curvature_source" -- attributed by share at λ_min's eigenvector
(`geometry.gm_split`): "head" (the M-term), "objective" (∇²_h L with the predictor's BatchNorm on running
statistics, through J_h) or "predictor_bn" (the predictor's BatchNorm on batch statistics). The answer reads
"λ_min < −bound at k of n collapsed points; the head's share the largest at j". Points after escape are counted
apart. Next to it: whether the head started collapsed by the run's step-0 criterion (protocol.train.collapse_start)
and whether its outputs escaped collapse (out_std of the last training record above the same threshold).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from headprobe.stats.saddle_grid import escape_diagnostics

PAPER = {"swish": "72/100 epochs (Swish, collapsed)", "silu": "72/100 epochs (Swish, collapsed)",
         "relu": "1/100 epochs (ReLU, collapsed)"}


def _paper(config: dict) -> str:
    if config.get("type") != "mlp":
        return ""
    return PAPER.get(str(config.get("act")), "")


SOURCES = ("head", "objective", "predictor_bn")


def point_collapsed(record: dict) -> bool | None:
    """Whether a tracked point's state is collapsed: its "collapsed" flag (tracking writes it with
    `geometry.collapse_threshold`); None when the record has none."""
    flag = record.get("collapsed")
    return flag if isinstance(flag, bool) else None


def summarise_collapse(results: dict, records: Sequence[dict]) -> dict:
    """{head: summary} for every head with split curvature records (none: {}). A summary holds "n_points",
    "n_collapsed" (points whose state is collapsed, `point_collapsed`), "n_unknown" (no criterion recorded),
    "negative" (λ_min < −bound among the collapsed points), "from_head", "from_objective", "from_predictor_bn"
    (those by share), "negative_after_escape" (negative points whose state is not collapsed), "negative_frac"
    (negative / n_collapsed, None without collapsed points), "answer" (the sentence), "m_norm_ratio_median",
    "loss_h_indefinite_frac" (over the collapsed points), "collapsed_start" (bool or None when the run did not record
    it), "out_std_start", "threshold", "out_std_uniform", "out_std_end" (last training record), "escaped" (out_std_end
    > threshold; None when either is unknown), "paper", and `escape_diagnostics`'s keys."""
    start = results.get("protocol", {}).get("train", {}).get("collapse_start") or {}
    out: dict = {}
    for name, head in results.get("heads", {}).items():
        points = [r for r in records if r.get("stage") == "geometry" and r.get("head") == name
                  and "curvature_source" in r]
        if not points:
            continue
        train = [r for r in records if r.get("stage") == "train" and r.get("head") == name
                 and isinstance(r.get("out_std"), (int, float)) and math.isfinite(r["out_std"])]
        begin = start.get(name, {})
        threshold = begin.get("threshold")
        states = [point_collapsed(r) for r in points]
        collapsed = [r for r, c in zip(points, states, strict=True) if c]
        negative = [r for r in collapsed if r["curvature_source"] != "none"]
        counts = {src: sum(r["curvature_source"] == src for r in negative) for src in SOURCES}
        after = sum(r["curvature_source"] != "none" for r, c in zip(points, states, strict=True) if c is False)
        end = train[-1]["out_std"] if train else None
        steps = [r for r in records if r.get("stage") == "train" and r.get("head") == name]
        escape = escape_diagnostics(points, states, steps, results)
        ratios = [r["m_norm_ratio"] for r in collapsed if isinstance(r.get("m_norm_ratio"), (int, float))]
        n = len(collapsed)
        out[name] = {
            "n_points": len(points), "n_collapsed": n, "n_unknown": sum(c is None for c in states),
            "negative": len(negative), **{f"from_{src}": counts[src] for src in SOURCES},
            "negative_after_escape": after, "negative_frac": len(negative) / n if n else None,
            "answer": (f"λ_min < −bound at {len(negative)} of {n} collapsed points; the head's share the largest "
                       f"at {counts['head']}" if n else f"no collapsed point among {len(points)} tracked"),
            "m_norm_ratio_median": statistics.median(ratios) if ratios else None,
            "loss_h_indefinite_frac": sum(bool(r.get("negative_loss_h")) for r in collapsed) / n if n else None,
            "collapsed_start": begin.get("collapsed"), "out_std_start": begin.get("out_std"),
            "threshold": threshold, "out_std_uniform": begin.get("out_std_uniform", points[0].get("out_std_uniform")),
            "out_std_end": end,
            "escaped": None if end is None or threshold is None else bool(end > threshold),
            "paper": _paper(head.get("config", {})),
        } | escape
    return out


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


COLUMNS = ("head", "λ_min < −bound (collapsed points)", "fraction", "largest share: head", "objective",
           "predictor BN", "negative after escape", "collapsed / tracked", "median ‖M‖/‖H‖", "∇²_h L indefinite",
           "collapsed at step 0", "out_std step 0", "threshold", "out_std end", "escaped", "median λ_min/λ_max",
           "Σ lr·|λ_min|·Δsteps", "escape step", "curvature explains escape", "paper (λ_min < 0)")


def collapse_rows(summary: dict) -> tuple[list[str], list[list]]:
    """(header, rows): the table of `summarise_collapse`'s output that the Geometry section of report.html shows,
    one row of values per head; no rows when the run tracked no split curvature."""
    rows = [[name, f"{s['negative']}/{s['n_collapsed']}", s["negative_frac"], s["from_head"], s["from_objective"],
             s["from_predictor_bn"], s["negative_after_escape"], f"{s['n_collapsed']}/{s['n_points']}",
             s["m_norm_ratio_median"], s["loss_h_indefinite_frac"], s["collapsed_start"], s["out_std_start"],
             s["threshold"], s["out_std_end"], s["escaped"], s["lambda_ratio_median"], s["escape_drive_sum"],
             s["escape_step"], s["curvature_explains_escape"], s["paper"]] for name, s in summary.items()]
    return list(COLUMNS), rows
