"""Several runs side by side (a depth ablation, an activation sweep): one row per (tap, metric), one column per run.

`write_compare(run_dirs, out_dir)` writes ``compare.csv`` (long format, one `pandas.read_csv` away: a ``run``
column, then the columns of each run's ``results.csv``, `tidy.TIDY_COLUMNS`) and a self-contained ``compare.html``
(one row per (tap, metric), one column per run); `compare_table` in `table.py` prints those rows in the terminal.
Where the runs are a head ablation with a "no head" arm (`stats.cross_run.cross_run_answers`), it also writes
``cross_run.json``: per arm the answers of `headprobe claims` across runs (the arm's backbone against the no-head
backbone of the same seed, paired on test images) and within the arm (z → h pooled over its runs), with the
crossed interval over seeds and images, and compare.html shows the same numbers.

>>> write_compare(["runs/depth1", "runs/depth2"], "runs")  # doctest: +SKIP
{'csv': PosixPath('runs/compare.csv'), 'html': PosixPath('runs/compare.html')}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from headprobe.record.tidy import compare_long_csv

from .markup import fmt, render


def run_labels(run_dirs: Sequence[str | Path]) -> dict[str, Path]:
    """label → run directory; the folder name, lengthened with its parents until every label is unique."""
    paths = [Path(p) for p in run_dirs]
    depth = 1
    while True:
        labels = ["/".join(p.resolve().parts[-depth:]) for p in paths]
        if len(set(labels)) == len(labels) or depth > max(len(p.resolve().parts) for p in paths):
            break
        depth += 1
    if len(set(labels)) != len(labels):
        raise ValueError("the same run directory was given twice; pass each run once.")
    return dict(zip(labels, paths, strict=True))


def sweep_runs(paths: Sequence[str | Path]) -> list[Path]:
    """The run folders named by `paths`: a folder with results.json is a run; a folder without one whose
    sub-folders hold results.json (a sweep's folder) stands for those runs, in name order; anything else is kept
    as given (reading it then says what is wrong)."""
    out = []
    for path in map(Path, paths):
        runs = [] if (path / "results.json").exists() or not path.is_dir() else sorted(
            p for p in path.iterdir() if (p / "results.json").is_file())
        out += runs or [path]
    return out


def default_out_dir(run_dirs: Sequence[str | Path]) -> Path:
    """Where a comparison goes without --out: next to the runs, in the deepest folder holding all of them (runs/
    for runs/a runs/b; runs/ for runs/x/a runs/y/b); the current directory only when they share nothing but /."""
    import os

    parents = [str(Path(p).resolve().parent) for p in run_dirs]
    shared = Path(os.path.commonpath(parents))
    return shared if shared.parent != shared else Path.cwd()


def compare_rows(runs: Mapping[str, dict]) -> tuple[list[str], list[list]]:
    """header ["tap", "metric", *labels] and one row per (tap, metric) seen in any run, None where absent."""
    keys: list[tuple[str, str]] = []
    for results in runs.values():
        for tap_name, tap in results.get("taps", {}).items():
            keys += [(tap_name, m) for m in tap.get("metrics", {}) if (tap_name, m) not in keys]
    rows = [[tap, metric, *(r.get("taps", {}).get(tap, {}).get("metrics", {}).get(metric) for r in runs.values())]
            for tap, metric in keys]
    return ["tap", "metric", *runs], rows


def _run_summary(label: str, path: Path, results: dict) -> list:
    recipe = results.get("recipe", {})
    heads = ", ".join(results.get("heads", {})) or "—"
    verdicts = ", ".join(f"{h}: {v.get('verdict')}" for h, v in results.get("buffer", {}).items()) or "—"
    return [label, str(path), results.get("backbone", {}).get("id", "?"), results.get("data", {}).get("source", "?"),
            heads, (recipe.get("objective") or {}).get("name") or "—", verdicts, results.get("status", "?")]


def paired_rows(answers: Mapping) -> tuple[list[str], list[list]]:
    """(header, rows) of `cross_run.cross_run_answers`: one row per part (within an arm, across runs), question,
    arm and measure, the primary first (with its answer), then the secondary measures (descriptions)."""
    rows = []
    for part in ("within", "across"):
        for key, claim in answers[part].items():
            for label, record in claim["arms"].items():
                measures = ([(claim["primary"], record, record.get("answer"))] if "change" in record else []) + [
                    (metric, change, "description") for metric, change in (record.get("secondary") or {}).items()]
                for metric, change, answer in measures:
                    ci = change.get("ci95")
                    rows.append([part, key, label, f"{record['tap']} · {metric}", change["backbone"], change["head"],
                                 change["change"],
                                 f"[{fmt(ci[0])}, {fmt(ci[1])}]" if ci else "—",
                                 change.get("interval", ""), answer or "—",
                                 f"{change['n_seeds']} × {change['n_units']}" if change.get("n_units")
                                 else f"{change['n_seeds']} seeds"])
    header = ["part", "question", "arm", "tap · measure", "from", "to", "change", "95% interval", "interval",
              "answer", "seeds × units"]
    return header, rows


def compare_html(runs: Mapping[str, dict], paths: Mapping[str, Path], paired: Mapping | None = None) -> str:
    header, rows = compare_rows(runs)
    metrics = []
    for tap, metric, *values in rows:
        numbers = [v for v in values if isinstance(v, (int, float))]
        best = max(numbers) if metric.endswith(".acc") and len(numbers) > 1 else None
        metrics.append({"tap": tap, "metric": metric,
                        "cells": [(fmt(v), v is not None and v == best) for v in values]})
    paired_header, paired_table = paired_rows(paired) if paired else ([], [])
    return render("compare.html.j2", title="headprobe compare", header=header, metrics=metrics,
                  runs=[_run_summary(label, paths[label], results) for label, results in runs.items()],
                  paired=paired, paired_header=paired_header, paired_rows=paired_table)


def write_compare(run_dirs: Sequence[str | Path], out_dir: str | Path) -> dict[str, Path]:
    """Read each run's results.json and write out_dir/compare.csv and out_dir/compare.html, and out_dir/cross_run.json
    where the runs are a head ablation with a "no head" arm (`stats.cross_run.cross_run_answers`)."""
    import json

    from headprobe.record.directory import atomic_write_text, read_results
    from headprobe.stats.cross_run import cross_run_answers

    paths = run_labels(run_dirs)
    runs = {label: read_results(path) for label, path in paths.items()}
    out_dir = Path(out_dir)
    written = {"csv": out_dir / "compare.csv", "html": out_dir / "compare.html"}
    paired = cross_run_answers(list(paths.values()))
    if paired is not None:
        written["cross_run"] = out_dir / "cross_run.json"
        atomic_write_text(written["cross_run"], json.dumps(paired, indent=1, default=str))
    atomic_write_text(written["csv"], compare_long_csv(runs))
    atomic_write_text(written["html"], compare_html(runs, paths, paired))
    return written
