"""The sentences and units of an answer: `answer_line` ("Q-aug: d2 head discards augmentation information
(rotation.acc): −7.4 points [−11.9, −2.1], 3 seeds × 200 test images — yes"), `in_units` (an accuracy in percent,
its change in points), `units_of` and `head_phrase`. Split from `stats/claims.py`, which decides the answers."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from headprobe.stats.claims import Question

__all__ = ["answer_line", "head_phrase", "in_units", "units_of"]


def in_units(metric: str, value: float, signed: bool = False) -> str:
    """An accuracy (or its change) in percent or points (0.074 → "7.4"), any other value or change as a number; a
    true minus, and with `signed` a plus on a positive value."""
    sign = "+" if signed else ""
    text = f"{100 * value:{sign}.1f}" if metric.endswith(".acc") else f"{value:{sign}.3g}"
    return text.replace("-", "−")


def units_of(metric: str) -> str:
    """The units `in_units` writes `metric`'s values and changes in (an accuracy of 0.8867 as 88.7 percent, its
    change in points: a row never mixes fractions and points)."""
    return "percent; change in points" if metric.endswith(".acc") else "the measure's own; change likewise"


def head_phrase(head: str) -> str:
    """"mlp head", but "head" (not "head head") for a head whose name already ends in "head"."""
    return head if head.lower().endswith("head") else f"{head} head"


def _holm_note(record: dict) -> str:
    """Why an answer is "undecided" when its interval alone would decide it: the p-values before and after Holm's
    correction across the question's heads (the answer is read from the second)."""
    p, p_holm = record.get("p"), record.get("p_holm")
    if record.get("answer") != "undecided" or p is None or p_holm is None:
        return ""
    return f" (p {p:.2g}; Holm-adjusted across the question's heads {p_holm:.2g}, resolved only below α = 0.05)"


def answer_line(question: Question, head: str, record: dict) -> str:
    """"Q-aug: d2 head discards augmentation information (rotation.acc): −7.4 points [−11.9, −2.1], 3 seeds × 200
    test images — yes"; a one-seed interval says it covers the test images only."""
    metric = question.primary
    if "change" not in record:
        return f"{question.key}: {head_phrase(head)}: {metric} was not measured — {record['answer']}"
    points = " points" if metric.endswith(".acc") else ""
    margin = (f", margin ±{in_units(metric, question.margin)}{points}" if question.is_equivalence else
              f", margin {in_units(metric, question.margin)}{points}" if question.margin else "")
    ci = record.get("ci95")
    interval = f" [{in_units(metric, ci[0])}, {in_units(metric, ci[1])}]" if ci else " (no interval)"
    n_seeds = record.get("n_seeds", 1)
    size = f"{n_seeds} seed{'s' if n_seeds != 1 else ''}"
    if record.get("n_units"):
        size += f" × {record['n_units']} {record.get('unit') or 'units'}"
    if record.get("interval") == "test images only":
        size += " (interval over the test images only)"
    return (f"{question.key}: {head_phrase(head)} {question.finding} ({metric}{margin}): "
            f"{in_units(metric, record['change'], signed=True)}{points}{interval}{_null_clause(metric, record)}, "
            f"{size} — {record['answer']}{_holm_note(record)}")


def _null_clause(metric: str, record: dict) -> str:
    """"; against its null relu.init: −3.1 points [−5.0, −1.2] (decides)", or where the recipe has no null heads
    nothing (a null head's own line says it is one)."""
    if record.get("is_null"):
        return " (a null head: never trained)"
    vs = record.get("vs_null")
    if not vs:
        return ""
    if "change" not in vs:
        return f"; against its null {vs['null']}: not measured"
    points = " points" if metric.endswith(".acc") else ""
    ci = vs.get("ci95")
    interval = f" [{in_units(metric, ci[0])}, {in_units(metric, ci[1])}]" if ci else " (no interval)"
    decides = " (decides)" if record.get("decided_on") == "head − null" else ""
    return f" vs the backbone; {in_units(metric, vs['change'], signed=True)}{points}{interval} against its null " \
           f"{vs['null']}{decides}"
