"""The terminal tables (headprobe/report/table.py): one run's summary, several runs side by side, the ±interval
text, and the lines `headprobe report` prints under the table."""

import io
import re

import pytest
from rich.console import Console

from headprobe.report.table import compare_table, half_width, print_summary, summary_table, with_interval


def _tap(metrics: dict, intervals: dict | None = None) -> dict:
    return {"metrics": metrics, "uncertainty": {m: {"ci95": ci} for m, ci in (intervals or {}).items()}}


def _results(**extra) -> dict:
    return {"status": "complete",
            "backbone": {"id": "hf:tiny", "dim": 32},
            "data": {"source": "sklearn-digits", "n_train": 200, "n_test": 80, "n_classes": 10},
            "taps": {"backbone": _tap({"linear.acc": 0.962, "rankme": 12.5}, {"linear.acc": [0.953, 0.971]}),
                     "relu": _tap({"linear.acc": 0.9, "knn.k5.acc": 0.875})},
            **extra}


def _render(renderable, width: int = 200) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


def _rows(table) -> list[list[str]]:
    """The table's header and body rows as the terminal shows them, one list of cell texts per line."""
    return [[cell.strip() for cell in re.split(r"[│┃]", line)[1:-1]]
            for line in _render(table).splitlines() if re.match(r"\s*[│┃]", line)]


@pytest.mark.parametrize("ci, value, half", [
    ([0.953, 0.971], 0.962, 0.009),
    ([0.90, 0.97], 0.95, 0.05),  # an asymmetric interval: the larger half
    ([0.50, 0.60], 0.70, 0.20),  # an interval that misses the point estimate: the distance to its far end
    ([0.50, 0.50], 0.50, 0.0),
])
def test_half_width_is_the_larger_half_of_the_interval(ci, value, half):
    assert half_width(_tap({"m": value}, {"m": ci}), "m") == pytest.approx(half)


@pytest.mark.parametrize("tap", [
    {"metrics": {"m": 0.5}},
    {"metrics": {"m": 0.5}, "uncertainty": None},
    _tap({"m": 0.5}, {"other": [0.4, 0.6]}),
    _tap({"m": 0.5}, {"m": None}),  # rankme: measured once, no interval
    _tap({"m": 0.5}, {"m": [None, 0.6]}),
    _tap({"m": 0.5}, {"m": [0.4, 0.5, 0.6]}),
    _tap({"m": None}, {"m": [0.4, 0.6]}),  # a NaN metric, stored as null
    _tap({}, {"m": [0.4, 0.6]}),
    _tap({"m": "n/a"}, {"m": [0.4, 0.6]}),
])
def test_half_width_is_none_without_a_usable_interval_and_value(tap):
    assert half_width(tap, "m") is None


def test_with_interval_formats_the_value_and_its_half_width():
    assert with_interval(_tap({"m": 0.962}, {"m": [0.953, 0.971]}), "m") == "0.9620 ±0.0090"
    assert with_interval(_tap({"m": 0.962}), "m") == "0.9620"
    assert with_interval(_tap({"m": 3}, {"m": [2, 4]}), "m") == "3 ±1.0000"  # an int stays an int
    assert with_interval(_tap({"m": 123456.0}), "m") == "1.23e+05"
    assert with_interval(_tap({"m": -0.5}), "m") == "-0.5000"
    assert with_interval(_tap({"m": None}), "m") == "—"
    assert with_interval(_tap({}), "m") == "—"
    assert with_interval({}, "m") == "—"


def test_summary_table_has_a_column_per_tap_and_a_row_per_metric():
    table = summary_table(_results())
    assert [str(c.header) for c in table.columns] == ["metric", "backbone", "relu"]
    assert table.row_count == 3
    assert _rows(table) == [
        ["metric", "backbone", "relu"],
        ["linear.acc", "0.9620 ±0.0090", "0.9000"],
        ["rankme", "12.5000", "—"],  # metric order: first seen; a tap without the metric shows a dash
        ["knn.k5.acc", "—", "0.8750"],
    ]
    assert table.title == "hf:tiny (32-d) on sklearn-digits [200 train / 80 test, 10 classes]"


def test_summary_table_of_a_run_that_recorded_nothing_yet():
    table = summary_table({"status": "running"})
    assert [str(c.header) for c in table.columns] == ["metric"] and table.row_count == 0
    assert table.title == "? (?-d) on ? [? train / ? test, ? classes]"
    assert _rows(table) == [["metric"]]


def test_compare_table_has_a_row_per_tap_and_metric_and_a_column_per_run():
    a = _results()
    b = {"taps": {"backbone": _tap({"linear.acc": 0.95}, {"linear.acc": [0.93, 0.96]}),
                  "mlp": _tap({"linear.acc": 0.7})}}
    table = compare_table({"depth2": a, "depth3": b})
    assert [str(c.header) for c in table.columns] == ["tap", "metric", "depth2", "depth3"]
    assert _rows(table) == [
        ["tap", "metric", "depth2", "depth3"],
        ["backbone", "linear.acc", "0.9620 ±0.0090", "0.9500 ±0.0200"],
        ["backbone", "rankme", "12.5000", "—"],
        ["relu", "linear.acc", "0.9000", "—"],
        ["relu", "knn.k5.acc", "0.8750", "—"],
        ["mlp", "linear.acc", "—", "0.7000"],
    ]


def _summary(results: dict, width: int = 200, run_dir=None) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    print_summary(results, run_dir, console=console)
    return console.file.getvalue()


def test_print_summary_prints_the_verdicts_timing_and_where_the_results_are(tmp_path):
    results = _results(buffer={"relu": {"verdict": "buffer", "support": 3, "against": 1, "unresolved": 2},
                               "lin": {"verdict": "inconclusive"}},
                       timing={"train_s": 1.25, "probe_s": 10.0}, timing_ratios={"track_over_train": 0.256})
    lines = _summary(results, run_dir=tmp_path / "r").splitlines()
    assert ("buffer verdicts: relu → buffer (3 for, 1 against, 2 unresolved), "
            "lin → inconclusive (0 for, 0 against, 0 unresolved)") in lines
    assert "timing: train_s 1.2s, probe_s 10.0s" in lines
    assert "cost ratios: track_over_train 0.26" in lines
    assert lines[-1] == f"results: {tmp_path / 'r' / 'results.json'}"
    assert not any(line.startswith("status:") for line in lines)  # a complete run says nothing more


def test_print_summary_of_a_failed_run_says_why_and_leaves_out_what_it_lacks():
    text = _summary({**_results(), "status": "failed", "error": {"message": "while running probe 'knn': boom"}})
    assert "status: failed while running probe 'knn': boom" in text
    assert "buffer verdicts" not in text and "timing:" not in text and "cost ratios" not in text
    assert "results:" not in text
    assert "status: running" in _summary({"status": "running"})


def test_print_summary_to_a_pipe_prints_the_whole_table_however_narrow():
    wide = {f"tap_number_{i}": _tap({"linear.acc": 0.5 + i / 100}) for i in range(8)}
    text = _summary({**_results(), "taps": wide}, width=40)
    assert "…" not in text
    for i in range(8):
        assert f"tap_number_{i}" in text and f"{0.5 + i / 100:.4f}" in text
