"""Rich terminal tables for one run (`summary_table`) and several runs (`compare_table`, `print_compare`).

Where stdout is not a terminal (a log file, a pipe) a table is printed as wide as it needs, never wrapped at 80
columns with cut labels; `width` sets the width outright (`headprobe compare --width`)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from .claims import answer_lines


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1e4 else f"{value:.3g}"
    return "—" if value is None else str(value)


def half_width(tap: dict, metric: str) -> float | None:
    """The larger half of the 95% interval of `metric` at this tap (results.json "uncertainty"), or None."""
    record = (tap.get("uncertainty") or {}).get(metric) or {}
    ci, value = record.get("ci95"), tap.get("metrics", {}).get(metric)
    if not isinstance(ci, list) or len(ci) != 2 or not isinstance(value, (int, float)) or None in ci:
        return None
    return max(ci[1] - value, value - ci[0], 0.0)


def with_interval(tap: dict, metric: str) -> str:
    """`0.9620 ±0.0090` where the metric has an interval, else the value alone; a protocol value (`linear.C`, chosen
    on validation data) never has one: it is a setting, and a spread over seeds would read as a negative C."""
    from .glossary import is_protocol_value

    text = _fmt(tap.get("metrics", {}).get(metric))
    half = None if is_protocol_value(metric) else half_width(tap, metric)
    return text if half is None else f"{text} ±{_fmt(float(half))}"


def _metric_names(taps: dict) -> list[str]:
    names: list[str] = []
    for tap in taps.values():
        names += [m for m in tap.get("metrics", {}) if m not in names]
    return names


def summary_table(results: dict) -> Table:
    bb, data = results.get("backbone", {}), results.get("data", {})
    title = (
        f"{bb.get('id', '?')} ({bb.get('dim', '?')}-d) on {data.get('source', '?')} "
        f"[{data.get('n_train', '?')} train / {data.get('n_test', '?')} test, {data.get('n_classes', '?')} classes]"
    )
    taps = results.get("taps", {})
    table = Table(title=title, title_justify="left")
    table.add_column("metric", no_wrap=True)
    for name in taps:
        table.add_column(name, justify="right")
    for metric in _metric_names(taps):
        table.add_row(metric, *(with_interval(tap, metric) for tap in taps.values()))
    return table


# Run names longer than this are shortened in the terminal's columns (`short_labels`), with a legend under the table.
SHORT_LABEL = 16


def short_labels(labels: list[str]) -> dict[str, str]:
    """label → its column's name: the label itself when every one is at most SHORT_LABEL characters; else what tells
    the labels apart, where that is short and unique: the parts ("/" and "," separate them) not common to all,
    a swept key (`heads.0.type=mlp`) by its last name (`type=mlp`); else R1, R2, ...

    >>> short_labels(["sweep/heads.0.type=identity,seed=0", "sweep/heads.0.type=mlp,seed=0"])
    {'sweep/heads.0.type=identity,seed=0': 'type=identity', 'sweep/heads.0.type=mlp,seed=0': 'type=mlp'}
    """
    if all(len(label) <= SHORT_LABEL for label in labels):
        return {label: label for label in labels}
    import re

    parts = [re.split(r"[/,]", label) for label in labels]
    common = set.intersection(*map(set, parts)) if parts else set()
    short = [",".join(_short_part(p) for p in label_parts if p not in common) for label_parts in parts]
    if all(0 < len(name) <= SHORT_LABEL for name in short) and len(set(short)) == len(short):
        return dict(zip(labels, short, strict=True))
    return {label: f"R{i}" for i, label in enumerate(labels, 1)}


def _short_part(part: str) -> str:
    key, eq, value = part.partition("=")
    return f"{key.rsplit('.', 1)[-1]}={value}" if eq else part


def fit_width(console: Console, table: Table, width: int | None = None) -> None:
    """`width` columns for the console, or where it is not a terminal as many as `table` needs."""
    if width is not None:
        console.width = width
    elif not console.is_terminal:
        from rich.measure import Measurement

        needed = Measurement.get(console, console.options.update_width(10_000), table).maximum
        console.width = max(console.width, needed)


def print_compare(runs: dict[str, dict], console: Console, width: int | None = None,
                  paths: dict[str, str | Path] | None = None) -> None:
    """`compare_table` with short run names (`short_labels`), then their legend (`legend_table`: each name's run
    folder, from `paths` where given, and recipe). The table is as wide as `width`, else the terminal, else (a log,
    a pipe) as it needs; where the runs do not fit beside each other they are split over several tables, each with
    the tap and metric columns, so that no name is ever cut."""
    names = short_labels(list(runs))
    limit = width if width is not None else console.width if console.is_terminal else UNLIMITED
    for part in _column_groups(console, runs, names, limit):
        _print_whole(console, compare_table(part, names), limit)
    _print_whole(console, legend_table(runs, names, paths), limit)
    console.width = limit  # the lines printed after the tables (a log's paths) wrap no more than they do


def _print_whole(console: Console, table: Table, limit: int) -> None:
    """`table` at `limit` columns, or wider where a name would be cut (rich caps a print's width at the console's)."""
    needed = _needed(console, table)
    console.width = max(needed, 1) if limit >= UNLIMITED else max(limit, needed)
    console.print(table)


UNLIMITED = 100_000  # the width of a log or a pipe: no line is cut or wrapped


def _needed(console: Console, renderable) -> int:
    from rich.measure import Measurement

    return Measurement.get(console, console.options.update_width(10_000), renderable).maximum


def _column_groups(console: Console, runs: dict[str, dict], names: dict[str, str], limit: int) -> list[dict]:
    """`runs` split, in order, into groups whose `compare_table` fits in `limit` columns (one run at least each)."""
    groups: list[dict] = [{}]
    for label, results in runs.items():
        trial = {**groups[-1], label: results}
        if groups[-1] and _needed(console, compare_table(trial, names)) > limit:
            groups.append({label: results})
        else:
            groups[-1] = trial
    return groups


def legend_table(runs: dict[str, dict], names: dict[str, str], paths: dict[str, str | Path] | None = None) -> Table:
    """name → the run it heads: its label, its folder (`paths`, where given) and its recipe's name."""
    table = Table(title="runs", title_justify="left")
    for column in ("run", "label", "folder", "recipe"):
        table.add_column(column, no_wrap=True)
    for label, results in runs.items():
        folder = str((paths or {}).get(label, "—"))
        recipe = (results.get("recipe") or {}).get("name") or "—"
        table.add_row(names.get(label, label), label, folder, str(recipe))
    return table


def compare_table(runs: dict[str, dict], names: dict[str, str] | None = None) -> Table:
    """runs: label → results; one row per (tap, metric), one column per run, headed by names[label] (default
    the label). No cell wraps: a name or a number is whole or (`print_compare`) on the next table."""
    table = Table(title="headprobe compare", title_justify="left")
    table.add_column("tap", no_wrap=True)
    table.add_column("metric", no_wrap=True)
    for label in runs:
        table.add_column((names or {}).get(label, label), justify="right", no_wrap=True)
    from .compare import compare_rows

    for row in compare_rows(runs)[1]:
        table.add_row(row[0], row[1], *(with_interval(r.get("taps", {}).get(row[0], {}), row[1])
                                        for r in runs.values()))
    return table


def print_summary(results: dict, run_dir: Path | None = None, console: Console | None = None) -> None:
    console = console or Console()
    table = summary_table(results)
    fit_width(console, table)  # logs and pipes have no width to respect: the whole table rather than ellipses
    history = None
    if run_dir is not None:
        from .plots import read_records, train_history

        history = train_history(read_records(run_dir))
    answers = answer_lines(results, history)
    if answers:  # the answers open the summary; the table and the older one-vote verdicts follow
        console.print("answers to the paper's questions (head − backbone, 95% interval; docs/claims.md):",
                      markup=False, soft_wrap=True)
        for line in answers:
            console.print(f"  {line}", markup=False, soft_wrap=True)
    console.print(table)
    verdicts = results.get("buffer", {})
    if verdicts:
        console.print("buffer verdicts: " + ", ".join(
            f"{head} → {v.get('verdict')} ({v.get('support', 0)} for, {v.get('against', 0)} against, "
            f"{v.get('unresolved', 0)} unresolved)"
            for head, v in verdicts.items()))
    timing = results.get("timing", {})
    if timing:
        console.print("timing: " + ", ".join(f"{k} {v:.1f}s" for k, v in timing.items()))
    ratios = results.get("timing_ratios", {})
    if ratios:
        console.print("cost ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    if results.get("status") != "complete":
        console.print(f"[yellow]status: {results.get('status')}[/] {results.get('error', {}).get('message', '')}")
    if run_dir is not None:
        console.print(f"results: {Path(run_dir) / 'results.json'}")
