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


# Run labels longer than this become R1, R2, ... in the terminal's columns, with a legend under the table.
SHORT_LABEL = 16


def short_labels(labels: list[str]) -> dict[str, str]:
    """label → its column's name: the label itself when every one is at most SHORT_LABEL characters, else R1, R2, ...
    (a sweep's labels such as "heads.0.type=identity,seed=0" would make the table too wide to read)."""
    if all(len(label) <= SHORT_LABEL for label in labels):
        return {label: label for label in labels}
    return {label: f"R{i}" for i, label in enumerate(labels, 1)}


def fit_width(console: Console, table: Table, width: int | None = None) -> None:
    """`width` columns for the console, or where it is not a terminal as many as `table` needs."""
    if width is not None:
        console.width = width
    elif not console.is_terminal:
        from rich.measure import Measurement

        needed = Measurement.get(console, console.options.update_width(10_000), table).maximum
        console.width = max(console.width, needed)


def print_compare(runs: dict[str, dict], console: Console, width: int | None = None) -> None:
    """`compare_table` with short run labels (`short_labels`) and, where they were shortened, their legend."""
    names = short_labels(list(runs))
    table = compare_table(runs, names)
    fit_width(console, table, width)
    console.print(table)
    for label, name in names.items():
        if name != label:
            console.print(f"  {name} = {label}", markup=False, soft_wrap=True)


def compare_table(runs: dict[str, dict], names: dict[str, str] | None = None) -> Table:
    """runs: label → results; one row per (tap, metric), one column per run, headed by names[label] (default
    the label)."""
    table = Table(title="headprobe compare", title_justify="left")
    table.add_column("tap", no_wrap=True)
    table.add_column("metric", no_wrap=True)
    for label in runs:
        table.add_column((names or {}).get(label, label), justify="right")
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
