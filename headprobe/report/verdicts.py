"""The report's Buffer verdicts section: one card per head with its verdict, whether the head trained (its loss
curve, `convergence.training_convergence`), and the evidence, resolved first, then what the intervals leave open.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from markupsafe import Markup

from .convergence import training_convergence
from .markup import fmt, render
from .training import stopped_note

__all__ = ["buffer_section"]


def _evidence_cell(column: str, value) -> dict:
    """{"value", "cls"}: numbers right-aligned; the margin, signed so that positive = the way the claim predicts,
    green or red."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return {"value": fmt(value), "cls": None}
    cls = (" up" if value > 0 else " down" if value < 0 else "") if column == "margin" else ""
    return {"value": fmt(value), "cls": "num" + cls}


def _trained_line(records: Sequence[dict]) -> dict:
    verdict = training_convergence(records)
    if verdict["status"] == "unknown":
        text = f"trained? unknown ({verdict['n_points']} logged steps)"
    else:
        text = (f"trained? {verdict['status']} (loss {fmt(verdict['start'])} → {fmt(verdict['end'])}, "
                f"{100 * verdict['relative_decrease']:.0f}% lower)")
    return {"text": text, "cls": "legend" if verdict["converged"] in (True, None) else "note"}


def _evidence_tables(evidence: dict) -> list[dict]:
    """The resolved evidence, then the unresolved (with why), each {"title", "columns", "rows"}."""
    rows = {k: v for k, v in evidence.items() if isinstance(v, dict)}
    out = []
    for title, group in (("resolved", {k: v for k, v in rows.items() if v.get("resolved") in ("for", "against")}),
                         ("unresolved", {k: v for k, v in rows.items()
                                         if v.get("resolved") not in ("for", "against")})):
        if not group:
            continue
        columns = [c for c in dict.fromkeys(c for v in group.values() for c in v)
                   if c not in ("n_boot", "method") and (title == "unresolved" or c != "why_unresolved")]
        rows = [(name, [_evidence_cell(col, v.get(col)) for col in columns]) for name, v in group.items()]
        out.append({"title": title, "columns": columns, "rows": rows})
    return out


def buffer_section(results: dict, plots: Sequence, history: Mapping[str, Sequence[dict]]) -> Markup:
    buffer = results.get("buffer", {})
    note = None
    if not buffer:
        stopped = stopped_note(results, history)
        note = (f"No buffer verdict yet: {stopped}." if stopped
                else "No buffer verdict was recorded for the heads of this run." if results.get("heads")
                else "No buffer verdict: this run trained no head.")
    cards = []
    for head, entry in buffer.items():
        evidence = entry.get("evidence", {})
        facts = {k: v for k, v in entry.items() if k not in ("verdict", "evidence")}
        facts |= {k: v for k, v in evidence.items() if not isinstance(v, dict)}
        cards.append({"head": head, "verdict": entry.get("verdict", ""),
                      "trained": _trained_line(history[head]) if history.get(head) else None,
                      "facts": ", ".join(f"{k} {fmt(v)}" for k, v in facts.items()),
                      "tables": _evidence_tables(evidence)})
    return render("sections/buffer.html.j2", note=note, cards=cards)
