"""The report's answers section, after the summary that opens the page: the answer to each question of the paper
per head (results.json["claims"], `headprobe.stats.claims`), each with its change, 95% interval and size, the
secondary measures folded under it, and whether the head trained ("trained: loss fell from X to Y", or why that
cannot be told).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from markupsafe import Markup

from .convergence import MIN_POINTS, training_convergence
from .markup import fmt, render

__all__ = ["answer_lines", "answers_section", "trained_line"]

# Answer → badge colour class (templates/report.css): the claim holds, goes the other way, or is open.
BADGE = {"yes": "buffer", "equivalent": "buffer", "no": "no-buffer", "lost": "no-buffer", "gained": "mixed"}


def answer_lines(results: Mapping, history: Mapping[str, Sequence[dict]] | None = None) -> list[str]:
    """One line per question and head, in the order recorded ("Q-aug: d2 head discards ... — yes"); one line for
    a question whose primary measure the run did not measure. With the heads' logged losses (`history`), the line
    of a trained head that cannot be shown to have trained (barely trained, still falling, too few logged steps)
    says so first: its answer is about a head that may not have learned what the loss asks."""
    heads = results.get("heads") or {}
    doubt = {}
    for head, entry in heads.items():
        train = (entry or {}).get("train") or {}
        if history is not None and not str(train.get("status") or "").startswith("untrained") \
                and train.get("steps"):
            line = trained_line(history.get(head, []), train)
            if not line.startswith("trained:"):
                doubt[head] = line
    lines = []
    for key, claim in (results.get("claims") or {}).items():
        if not isinstance(claim, dict):
            continue
        if claim.get("not_measured"):
            lines.append(f"{key}: not answered — {claim['not_measured']}")
            continue
        for head, record in (claim.get("heads") or {}).items():
            if isinstance(record, dict) and "line" in record:
                lines.append(f"[{head}: {doubt[head]}] {record['line']}" if head in doubt else record["line"])
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
    if status.startswith("pretrained"):  # a checkpoint's own head (type: pretrained): probed as it came
        return "pretrained: the checkpoint's own head, probed as it came (not retrained here)"
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
    from ..stats.answer_text import in_units

    ci = record.get("ci95")
    return f"[{in_units(metric, ci[0])}, {in_units(metric, ci[1])}]" if ci else "no interval"


def _secondary(secondary: Mapping) -> tuple[list[dict], list[dict]]:
    """(rows, folded): the secondary measures' changes, the per-parameter aug_r2.* rows folded under aug_r2.mean.
    Each row in one unit: an accuracy and its change in percent and points, any other measure in its own."""
    from ..stats.answer_text import in_units, units_of

    def number(metric: str, value, signed: bool = False) -> str:
        return in_units(metric, value, signed) if isinstance(value, (int, float)) else fmt(value)

    rows, folded = [], []
    for metric, record in secondary.items():
        row = {"metric": metric, "units": units_of(metric), "backbone": number(metric, record.get("backbone")),
               "head": number(metric, record.get("head")), "change": number(metric, record.get("change"), True),
               "ci": _interval(metric, record), "interval": record.get("interval", "")}
        (folded if metric.startswith("aug_r2.") and metric != "aug_r2.mean" else rows).append(row)
    return rows, folded


def _margin(claim: Mapping) -> str:
    """The question's margin in its primary's units, as its answer lines write it ("2.0 points" for 0.02 accuracy)."""
    from ..stats.answer_text import in_units

    primary, margin = claim.get("primary") or "", claim.get("margin")
    if not isinstance(margin, (int, float)):
        return fmt(margin)
    return in_units(primary, margin) + (" points" if primary.endswith(".acc") else "")


def answers_section(results: Mapping, history: Mapping[str, Sequence[dict]]) -> Markup:
    claims = {k: c for k, c in (results.get("claims") or {}).items() if isinstance(c, dict)}
    heads = results.get("heads") or {}
    trained = {h: trained_line(history.get(h, []), (heads.get(h) or {}).get("train")) for h in heads} if claims else {}
    questions = []
    for key, claim in claims.items():
        answered = []
        for head, record in (claim.get("heads") or {}).items():
            rows, folded = _secondary(record.get("secondary") or {})
            answer = record.get("answer", "?")
            answered.append({"answer": answer, "badge": BADGE.get(answer, ""), "line": record.get("line", head),
                             "how": record.get("how", ""), "p": record.get("p"), "p_holm": record.get("p_holm"),
                             "secondary": rows, "folded": folded})
        questions.append({"key": key, "claim": claim, "heads": answered, "margin": _margin(claim)})
    return render("sections/answers.html.j2", questions=questions, trained=trained)
