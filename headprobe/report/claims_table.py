"""`headprobe claims RUN [RUN ...]`: the answers of one or more runs (results.json["claims"]) as the paper lays
them out, one row per run, question and head with the cell ``z / h(z) (Δ [95% CI], n)``: the primary measure at
the backbone and at the head, the change and its 95% interval, n = seeds × images. Accuracies are in percent and
their changes in points, as the paper writes them; other measures in their own units. The geometry questions
(Q-split, Q-saddle: `kind: value`, a measure of the head itself) have the cell ``value [95% CI] (k/n states, n)``.

Markdown and LaTeX (booktabs) are for pasting into a paper; CSV keeps every number unrounded (as results.json
holds it), with the interval rule and the Holm-adjusted p-value. None drops a row: a question the run could not
answer for a head is a "not measured" row, and every row says how its head trained (`trained`: the loss-curve
verdict of the "Did each head train?" card, `report.claims.trained_line`: "trained", "barely trained", "still
falling", "not trained", "trained?" where too few steps were logged); Markdown and LaTeX end on a footnote saying so.

>>> row = {"measure": "rotation.acc", "backbone": 0.5227, "head_value": 0.3755, "change": -0.1472,
...        "ci95": [-0.19, -0.10], "n_seeds": 3, "n_units": 200}
>>> paper_cell(row)
'52.3 / 37.5 (−14.7 [−19.0, −10.0], 3×200)'
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ACROSS_HEADER", "FORMATS", "claims_rows", "cross_run_rows", "format_claims", "paper_cell"]

FORMATS = ("md", "latex", "csv")
CSV_COLUMNS = ("run", "question", "measure", "role", "head", "tap", "backbone", "head_value", "change", "value",
               "count", "ci_low", "ci_high", "n_seeds", "n_units", "unit", "interval", "answer", "p", "p_holm",
               "trained", "training", "null", "null_value", "change_vs_null", "ci_low_vs_null", "ci_high_vs_null",
               "decided_on")
NOT_MEASURED = "not measured"
FOOTNOTE = ("trained: each head's loss curve (converged = trained; barely trained, still falling, not trained: "
            "read its answer with care; trained?: too few logged steps to tell). not measured: the run did not "
            "measure the question's primary measure at that head. Geometry questions (Q-whiten, Q-metric, Q-split, "
            "Q-saddle) give the head's own value [95% CI], with the count of states where there is one.")


def training_lines(run_dirs: Mapping[str, str | Path]) -> dict[str, dict[str, str]]:
    """run label → head → how it trained (`report.claims.trained_line` of its metrics.jsonl and results.json)."""
    from headprobe.record.directory import read_results

    from .claims import trained_line
    from .plots import read_records, train_history

    lines = {}
    for label, path in run_dirs.items():
        history, heads = train_history(read_records(path)), read_results(path).get("heads") or {}
        lines[label] = {h: trained_line(history.get(h, []), (heads.get(h) or {}).get("train")) for h in heads}
    return lines


def claims_rows(runs: Mapping[str, Mapping], secondary: bool = False,
                training: Mapping[str, Mapping[str, str]] | None = None) -> list[dict]:
    """One row per run, question and head (and with `secondary` one per secondary measure after it), from each
    run's results["claims"]; a head or question without the primary measure a "not measured" row; training:
    `training_lines` of the runs, for the "trained" flag. ValueError naming the run when it has no answers."""
    rows = []
    for label, results in runs.items():
        claims = results.get("claims") or {}
        if not claims:
            raise ValueError(f"run {label} has no answers (results.json has no \"claims\"): it trained no head, or "
                             "stopped before probing them (`headprobe run --resume --out RUN_DIR` finishes it).")
        _check_shape(label, claims)
        trained = (training or {}).get(label, {})
        for question, claim in claims.items():
            if not claim.get("heads"):  # no head had any of the question's measures
                rows.append({"run": label, "question": question, "head": "—", "measure": claim["primary"],
                             "role": "primary", "answer": NOT_MEASURED, "trained": None, "training": None})
            for head, record in (claim.get("heads") or {}).items():
                line = trained.get(head)
                base = {"run": label, "question": question, "head": head, "tap": record.get("tap"),
                        "trained": ("null, never trained" if line and "(null)" in line else
                                    line.split(":", 1)[0] if line else None), "training": line}
                numbers = _numbers(record) if "change" in record else _values(record) if _is_value(record) else {}
                vs = record.get("vs_null") or {}
                against = {"null": vs.get("null"), "null_value": vs.get("null_value"),
                           "change_vs_null": vs.get("change"), "ci95_vs_null": vs.get("ci95"),
                           "decided_on": record.get("decided_on")} if "change" in vs else {}
                rows.append(base | numbers | against | {"measure": claim["primary"], "role": "primary",
                                                        "answer": record.get("answer") if numbers else NOT_MEASURED,
                                                        "p": record.get("p"), "p_holm": record.get("p_holm")})
                if secondary:
                    rows += [base | (_values(change) if _is_value(change) else _numbers(change))
                             | {"measure": metric, "role": "secondary", "p": None, "p_holm": None,
                                "answer": change.get("answer") if _is_value(change) else None}
                             for metric, change in (record.get("secondary") or {}).items()]
    return rows


def _is_value(record) -> bool:
    """A value answer (the geometry questions, `kind: value`: a measure of the head itself with its interval,
    no backbone to compare with), not a change."""
    return isinstance(record, Mapping) and "change" not in record and _is_number(record.get("value"))


def _values(record: Mapping) -> dict:
    """A value answer's numbers; a count of states (Q-saddle) as "count"."""
    count = (f"{record['n_negative']}/{record['n_collapsed']}" if _is_number(record.get("n_negative"))
             and _is_number(record.get("n_collapsed")) else None)
    return {k: record.get(k) for k in ("value", "ci95", "n_seeds", "n_units", "unit", "interval")} | {"count": count}


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_shape(label: str, claims) -> None:
    """ValueError with a sentence where a run's claims are not what `stats.claims.answer_questions` writes."""
    fix = "the file was edited or damaged; rerun the study (or restore results.json)."
    if not isinstance(claims, dict):
        raise ValueError(f"run {label}: \"claims\" is a {type(claims).__name__}, not a mapping of questions; {fix}")
    for question, claim in claims.items():
        heads = claim.get("heads") if isinstance(claim, dict) else None
        if not isinstance(heads, dict) or not isinstance(claim.get("primary"), str):
            raise ValueError(f"run {label}: claims.{question} has no primary measure or no heads; {fix}")
        for head, record in heads.items():
            numbers = ("backbone", "head", "change") if isinstance(record, dict) and "change" in record else ()
            if not isinstance(record, dict) or not all(_is_number(record.get(k)) for k in numbers):
                raise ValueError(f"run {label}: claims.{question}.heads.{head} is not an answer with numbers; {fix}")


def _numbers(record: Mapping) -> dict:
    """The change record's numbers; the head's value as "head_value" ("head" names the head)."""
    return {k: record.get(k) for k in ("backbone", "change", "ci95", "n_seeds", "n_units", "unit", "interval")} | {
        "head_value": record.get("head")}


def paper_cell(row: Mapping) -> str:
    """``z / h(z) (Δ [95% CI], n)`` of one row; accuracies in percent, changes in points; "—" for a measure the
    run did not measure."""
    from ..stats.answer_text import in_units

    if row.get("change") is None and row.get("value") is not None:  # a value answer: value [95% CI], n
        ci = row.get("ci95")
        interval = f" [{_short(ci[0])}, {_short(ci[1])}]" if ci else " [no interval]"
        count = f"{row['count']} {row.get('unit') or ''}, " if row.get("count") else ""
        seeds = row.get("n_seeds")
        n = f"{seeds}×{row['n_units']}" if row.get("n_units") else f"{seeds} seed{'' if seeds == 1 else 's'}"
        return f"{_short(row['value'])}{interval} ({count}{n})"
    if row.get("change") is None:
        return "—"
    measure = row["measure"]
    ci = row.get("ci95")
    interval = f" [{in_units(measure, ci[0])}, {in_units(measure, ci[1])}]" if ci else " [no interval]"
    seeds = row.get("n_seeds")
    n = f"{seeds}×{row['n_units']}" if row.get("n_units") else f"{seeds} seed{'' if seeds == 1 else 's'}"
    against = ""
    if row.get("change_vs_null") is not None:  # the change against the head's null (`null_heads`)
        nci = row.get("ci95_vs_null")
        ninterval = f" [{in_units(measure, nci[0])}, {in_units(measure, nci[1])}]" if nci else ""
        decides = ", decides" if row.get("decided_on") == "head − null" else ""
        against = f"; vs {row['null']}: {in_units(measure, row['change_vs_null'], signed=True)}{ninterval}{decides}"
    return (f"{in_units(measure, row['backbone'])} / {in_units(measure, row['head_value'])} "
            f"({in_units(measure, row['change'], signed=True)}{interval}, {n}{against})")


def _short(value: float) -> str:
    return f"{value:.3g}".replace("-", "−")


HEADER = ("question", "measure", "run", "head", "z / h(z) (Δ [95% CI], n)", "answer", "trained")


def answer_cell(row: Mapping) -> str:
    """The answer; an undecided one with its p-values beside it (raw, then Holm-adjusted across the question's
    heads), so an interval that reads resolved but was not after Holm's correction explains itself."""
    answer = row.get("answer") or "—"
    p, holm = row.get("p"), row.get("p_holm")
    if answer == "undecided" and p is not None and holm is not None:
        return f"undecided (p {_short(p)}, Holm {_short(holm)})"
    return answer


def _cells(row: Mapping) -> list[str]:
    return [row["question"], row["measure"], row["run"], row["head"], paper_cell(row), answer_cell(row),
            row.get("trained") or "—"]


LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
         "$": r"\$", "−": "$-$", "×": r"$\times$", "Δ": r"$\Delta$", "—": "---"}


def _latex(text: str) -> str:
    """Text with LaTeX's special characters escaped, one character at a time (an escape is never escaped again)."""
    return "".join(LATEX.get(char, char) for char in text)


def format_claims(rows: list[dict], fmt: str, header: tuple[str, ...] = HEADER) -> str:
    """The rows as a Markdown table, a LaTeX booktabs tabular, or CSV (every number as results.json holds it);
    header: the table's column names (md, LaTeX; a row's cells are cut to them: rows across runs have no "trained"),
    with the footnote under a table that has the "trained" column."""
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for row in rows:
            ci = row.get("ci95") or [None, None]
            nci = row.get("ci95_vs_null") or [None, None]
            values = row | {"ci_low": ci[0], "ci_high": ci[1], "ci_low_vs_null": nci[0], "ci_high_vs_null": nci[1]}
            writer.writerow(["" if values.get(c) is None else repr(values[c]) if isinstance(values[c], float)
                             else values[c] for c in CSV_COLUMNS])
        return out.getvalue()
    if fmt == "md":
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in _cells(row)[:len(header)]) + " |"
                  for row in rows]
        return "\n".join(lines + (["", FOOTNOTE] if "trained" in header else [])) + "\n"
    if fmt == "latex":
        lines = [r"% headprobe claims: needs \usepackage{booktabs} (\toprule, \midrule, \bottomrule)",
                 r"\begin{tabular}{" + "l" * len(header) + "}", r"\toprule",
                 " & ".join(_latex(h) for h in header) + r" \\", r"\midrule"]
        lines += [" & ".join(_latex(cell) for cell in _cells(row)[:len(header)]) + r" \\" for row in rows]
        note = rf"\multicolumn{{{len(header)}}}{{p{{0.95\linewidth}}}}{{\footnotesize {_latex(FOOTNOTE)}}} \\"
        return "\n".join(lines + [r"\bottomrule", *([note] if "trained" in header else []), r"\end{tabular}"]) + "\n"
    raise ValueError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}.")


# The columns of the rows across runs (`cross_run_rows`, part "across"): the no-head backbone, then the arm's.
ACROSS_HEADER = ("question", "measure", "runs", "arm", "z reference arm / z with the head (Δ [95% CI], n)", "answer")
# The "run" of a row pooled over runs: within an arm (z → h), across runs (the arm's backbone vs no head's), or
# against the null arm (vs the backbone trained through a fixed random map).
POOLED = {"within": "pooled runs", "across": "across runs", "against_null": "across runs, vs the null arm"}


def cross_run_rows(answers: Mapping, part: str, secondary: bool = False) -> list[dict]:
    """The rows of one part ("within" or "across") of `stats.cross_run.cross_run_answers`, as `claims_rows`
    gives a run's: run "pooled runs" (z → h within an arm, pooled over its runs) or "across runs" (the arm's
    backbone minus the no-head backbone of the same seed), head the arm; with `secondary` the descriptions too."""
    rows = []
    for question, claim in (answers.get(part) or {}).items():
        for arm, record in claim["arms"].items():
            base = {"run": POOLED[part], "question": question, "head": arm, "tap": record.get("tap")}
            if "change" in record:
                rows.append(base | _numbers(record) | {"measure": claim["primary"], "role": "primary",
                                                       "answer": record.get("answer"), "p": record.get("p"),
                                                       "p_holm": record.get("p_holm")})
            if secondary:
                rows += [base | _numbers(change) | {"measure": metric, "role": "secondary", "answer": None, "p": None,
                                                    "p_holm": None}
                         for metric, change in (record.get("secondary") or {}).items()]
    return rows
