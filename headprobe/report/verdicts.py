"""The report's Buffer verdicts section: one card per head with its verdict, whether the head trained (its loss
curve, `convergence.training_convergence`), and the evidence, resolved first, then what the intervals leave open.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .convergence import training_convergence
from .markup import esc, fmt
from .training import stopped_note

__all__ = ["buffer_section"]


def _evidence_cell(column: str, value) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return f"<td>{esc(fmt(value))}</td>"
    # The margin is signed so that positive = the way the claim predicts.
    cls = (" up" if value > 0 else " down" if value < 0 else "") if column == "margin" else ""
    return f"<td class='num{cls}'>{esc(fmt(value))}</td>"


def _trained_line(records: Sequence[dict]) -> str:
    verdict = training_convergence(records)
    if verdict["status"] == "unknown":
        text = f"trained? unknown ({verdict['n_points']} logged steps)"
    else:
        text = (f"trained? {verdict['status']} (loss {fmt(verdict['start'])} → {fmt(verdict['end'])}, "
                f"{100 * verdict['relative_decrease']:.0f}% lower)")
    cls = "legend" if verdict["converged"] in (True, None) else "note"
    return f"<p class='{cls}'>{esc(text)}</p>"


def _evidence_tables(evidence: dict) -> str:
    rows = {k: v for k, v in evidence.items() if isinstance(v, dict)}
    out = ""
    for title, group in (("resolved", {k: v for k, v in rows.items() if v.get("resolved") in ("for", "against")}),
                         ("unresolved", {k: v for k, v in rows.items()
                                         if v.get("resolved") not in ("for", "against")})):
        if not group:
            continue
        columns = [c for c in dict.fromkeys(c for v in group.values() for c in v)
                   if c not in ("n_boot", "method") and (title == "unresolved" or c != "why_unresolved")]
        body = "".join(
            f"<tr><th>{esc(name)}</th>" + "".join(_evidence_cell(col, v.get(col)) for col in columns) + "</tr>"
            for name, v in group.items())
        out += (f"<h4>{esc(title)} evidence ({len(group)})</h4><table><thead><tr><th>evidence</th>"
                f"{''.join(f'<th>{esc(c)}</th>' for c in columns)}</tr></thead><tbody>{body}</tbody></table>")
    return out


def buffer_section(results: dict, plots: Sequence, history: Mapping[str, Sequence[dict]]) -> str:
    buffer = results.get("buffer", {})
    if not buffer:
        note = stopped_note(results, history)
        if note:
            return f"<p class='note'>No buffer verdict yet: {esc(note)}.</p>"
        if results.get("heads"):
            return "<p class='note'>No buffer verdict was recorded for the heads of this run.</p>"
        return "<p class='note'>No buffer verdict: this run trained no head.</p>"
    out = []
    for head, entry in buffer.items():
        evidence = entry.get("evidence", {})
        facts = {k: v for k, v in entry.items() if k not in ("verdict", "evidence")}
        facts |= {k: v for k, v in evidence.items() if not isinstance(v, dict)}
        out.append(f"<div class='card'><h3>{esc(head)} <span class='badge {esc(entry.get('verdict', ''))}'>"
                   f"{esc(entry.get('verdict', '?'))}</span></h3>"
                   + (_trained_line(history[head]) if history.get(head) else "")
                   + f"<p class='legend'>{esc(', '.join(f'{k} {fmt(v)}' for k, v in facts.items()))}</p>"
                   f"{_evidence_tables(evidence)}</div>")
    return "".join(out)
