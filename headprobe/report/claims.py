"""The report's opening section: the answer to each question of the paper per head (results.json["claims"],
`headprobe.stats.claims`), each with its change, 95% interval and size, the secondary measures folded under it, and
whether the head trained ("trained: loss fell from X to Y", or why that cannot be told).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from .convergence import MIN_POINTS, training_convergence
from .markup import esc, fmt

__all__ = ["answer_lines", "answers_section", "trained_line"]

# Answer → badge colour class (markup.CSS): the claim holds, goes the other way, or is open.
BADGE = {"yes": "buffer", "equivalent": "buffer", "no": "no-buffer", "lost": "no-buffer", "gained": "mixed"}


def answer_lines(results: Mapping) -> list[str]:
    """One line per question and head, in the order recorded ("Q-aug: d2 head discards ... — yes"); one line for
    a question whose primary measure the run did not measure."""
    lines = []
    for key, claim in (results.get("claims") or {}).items():
        if not isinstance(claim, dict):
            continue
        if claim.get("not_measured"):
            lines.append(f"{key}: not answered — {claim['not_measured']}")
            continue
        lines += [record["line"] for record in (claim.get("heads") or {}).values()
                  if isinstance(record, dict) and "line" in record]
    return lines


def _losses(records: Sequence[dict]) -> list[tuple[int, float]]:
    return sorted((r["step"], float(r["loss"])) for r in records if isinstance(r.get("step"), (int, float))
                  and isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"]))


def trained_line(records: Sequence[dict], train: Mapping | None = None) -> str:
    """"trained: loss fell from X to Y (converged)" from the head's logged loss (metrics.jsonl "train" records),
    or why that cannot be told: too few logged steps (then the first and last logged values, if two), a head with
    nothing to train, or no loss logged at all (then the final loss `heads[H]["train"]` records)."""
    train = train or {}
    status = str(train.get("status") or "")
    if status.startswith("untrained"):
        return f"not trained: {status}"
    points = _losses(records)
    seed = next((r["seed"] for r in records if "seed" in r), None)
    which = "" if seed is None else f" (seed {seed})"
    if len(points) >= MIN_POINTS:
        verdict = training_convergence(records)
        start, end = verdict["start"], verdict["end"]
        moved = "fell" if end < start else "rose"
        head = "trained" if verdict["status"] == "converged" else verdict["status"]
        return f"{head}: loss {moved} from {fmt(start)} to {fmt(end)}{which}, over {len(points)} logged steps"
    few = (f"only {len(points)} logged step{'s' if len(points) != 1 else ''} (at least {MIN_POINTS} tell whether "
           "it converged; lower train.log_every)")
    if len(points) >= 2:
        moved = "fell" if points[-1][1] < points[0][1] else "rose"
        return (f"trained? loss {moved} from {fmt(points[0][1])} (step {points[0][0]}) to {fmt(points[-1][1])} "
                f"(step {points[-1][0]}){which}; {few}")
    final = train.get("final_loss")
    tail = f"; final loss {fmt(final)} after {fmt(train.get('steps'))} steps" if final is not None else ""
    return f"trained? cannot tell: {few}{tail}"


def _interval(metric: str, record: Mapping) -> str:
    from ..stats.claims import in_units

    ci = record.get("ci95")
    return f"[{in_units(metric, ci[0])}, {in_units(metric, ci[1])}]" if ci else "no interval"


def _secondary(secondary: Mapping) -> str:
    """The secondary measures' changes; the per-parameter aug_r2.* rows folded under aug_r2.mean."""
    rows, folded = [], []
    for metric, record in secondary.items():
        row = (f"<tr><th>{esc(metric)}</th><td class='num'>{esc(fmt(record.get('backbone')))}</td>"
               f"<td class='num'>{esc(fmt(record.get('head')))}</td>"
               f"<td class='num'>{esc(fmt(record.get('change')))}</td>"
               f"<td class='num'>{esc(_interval(metric, record))}</td><td>{esc(record.get('interval', ''))}</td></tr>")
        (folded if metric.startswith("aug_r2.") and metric != "aug_r2.mean" else rows).append(row)
    head = ("<tr><th>measure</th><th>backbone</th><th>head</th><th>change</th><th>95% interval</th>"
            "<th>interval</th></tr>")
    out = f"<table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>" if rows else ""
    if folded:
        out += (f"<details><summary>aug_r2 per augmentation parameter ({len(folded)})</summary><table><thead>{head}"
                f"</thead><tbody>{''.join(folded)}</tbody></table></details>")
    return out


def answers_section(results: Mapping, history: Mapping[str, Sequence[dict]]) -> str:
    claims = results.get("claims") or {}
    if not claims:
        return ("<p class='note'>No question was answered in this run (it trained no head, stopped before probing "
                "them, or was written by a headprobe before the questions); see the buffer verdicts below.</p>")
    heads = results.get("heads") or {}
    out = ["<p class='legend'>Each question of the paper answered per head from one pre-declared primary measure: "
           "the change head − backbone, its 95% interval (with several seeds over retraining and test images "
           "together), and the answer after Holm's correction across the heads of that question. Secondary "
           "measures describe; they do not vote.</p>"]
    trained = {h: trained_line(history.get(h, []), (heads.get(h) or {}).get("train")) for h in heads}
    if trained:
        out.append("<div class='card'><h3>Did each head train?</h3>" + "".join(
            f"<p class='legend'><b>{esc(h)}</b>: {esc(line)}</p>" for h, line in trained.items()) + "</div>")
    for key, claim in claims.items():
        if not isinstance(claim, dict):
            continue
        body = [f"<h3>{esc(key)}: {esc(claim.get('asks', ''))}</h3>",
                f"<p class='legend'>primary {esc(claim.get('primary'))}, predicted {esc(claim.get('predicted'))}, "
                f"margin {esc(fmt(claim.get('margin')))}"
                + (f" (recipe override: {esc(claim['override'])})" if claim.get("override") else "")
                + f". {esc(claim.get('answer_rule', ''))}.</p>"]
        if claim.get("not_measured"):
            body.append(f"<p class='note'>{esc(claim['not_measured'])}.</p>")
        for head, record in (claim.get("heads") or {}).items():
            answer = record.get("answer", "?")
            body.append(f"<p><span class='badge {esc(BADGE.get(answer, ''))}'>{esc(answer)}</span> "
                        f"{esc(record.get('line', head))}</p><p class='legend'>{esc(record.get('how', ''))}; "
                        f"p {esc(fmt(record.get('p')))}, Holm {esc(fmt(record.get('p_holm')))}</p>"
                        + _secondary(record.get("secondary") or {}))
        out.append(f"<div class='card'>{''.join(body)}</div>")
    return "".join(out)
