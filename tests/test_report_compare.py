import csv
import re

import pytest
from report_run import results_dict, write_run

from headprobe.cli import main
from headprobe.report.compare import compare_rows, run_labels, write_compare


def _ablation_pair(root):
    """depth2: the fixture run; depth3: one more hidden tap (mlp@2), no linear head, another mlp accuracy."""
    a = results_dict()
    a["taps"]["mlp"]["uncertainty"] = {"linear.acc": {"ci95": [0.78, 0.84], "method": "paired bootstrap"}}
    b = results_dict()
    b["taps"] = {"backbone": b["taps"]["backbone"], "mlp@1": b["taps"]["mlp@1"],
                 "mlp@2": {"head": "mlp", "depth": 2, "metrics": {"linear.acc": 0.88}}, "mlp": b["taps"]["mlp"]}
    b["taps"]["mlp"]["metrics"] = {**b["taps"]["mlp"]["metrics"], "linear.acc": 0.77}
    return write_run(root / "depth2", a, records=[]), write_run(root / "depth3", b, records=[])


def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_compare_writes_one_row_per_run_tap_and_metric(tmp_path):
    a, b = _ablation_pair(tmp_path)
    written = write_compare([a, b], tmp_path / "out")
    rows = _read_csv(written["csv"])
    metrics = list(results_dict()["taps"]["backbone"]["metrics"])
    assert rows[0] == ["run", "tap", "head", "depth", "metric", "value", "low", "high", "seed"]
    taps_a = [("backbone", m) for m in metrics] + [("mlp@1", m) for m in metrics] + [("mlp", m) for m in metrics] \
        + [("lin", m) for m in metrics]
    taps_b = [("backbone", m) for m in metrics] + [("mlp@1", m) for m in metrics] + [("mlp@2", "linear.acc")] \
        + [("mlp", m) for m in metrics]
    assert [(r[0], r[1], r[4]) for r in rows[1:]] == [("depth2", *k) for k in taps_a] + [("depth3", *k) for k in taps_b]
    by_key = {(r[0], r[1], r[4]): r[2:4] + r[5:] for r in rows[1:]}
    assert by_key[("depth2", "mlp", "linear.acc")] == ["mlp", "2", "0.81", "0.78", "0.84", ""]  # the interval's ends
    assert by_key[("depth3", "mlp", "linear.acc")] == ["mlp", "2", "0.77", "", "", ""]
    assert by_key[("depth3", "mlp@2", "linear.acc")][:3] == ["mlp", "2", "0.88"]
    assert by_key[("depth2", "backbone", "linear.acc")][:2] == ["", "0"]
    assert float(by_key[("depth2", "backbone", "mi.infonce.ceiling")][2]) == pytest.approx(5.545177444479562)
    text = written["html"].read_text()
    assert "<b>0.8100</b>" in text and "<b>0.7700</b>" not in text  # the best accuracy of a row in bold
    assert "<b>0.9400</b>" not in text  # ... when there is something to compare it with
    assert "http" not in text and "<script" not in text
    assert compare_rows({"x": results_dict()})[0] == ["tap", "metric", "x"]


def test_run_labels_are_unique(tmp_path):
    runs = [tmp_path / "sweep1" / "relu", tmp_path / "sweep2" / "relu", tmp_path / "sweep2" / "gelu"]
    assert list(run_labels(runs)) == ["sweep1/relu", "sweep2/relu", "sweep2/gelu"]
    assert list(run_labels(runs[1:])) == ["relu", "gelu"]
    with pytest.raises(ValueError, match="given twice"):
        run_labels([runs[0], runs[0]])


def test_compare_command_prints_and_writes_next_to_the_runs_or_into_out(tmp_path, capsys):
    a, b = _ablation_pair(tmp_path / "runs")
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "depth2" in out and "depth3" in out and "mlp@2" in out and "compare.csv" in out
    assert {row[0] for row in _read_csv(tmp_path / "runs" / "compare.csv")[1:]} == {"depth2", "depth3"}
    assert "0.8100 ±0.0300" in out  # the terminal table prints intervals
    assert (tmp_path / "runs" / "compare.html").is_file()
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / "compare.csv").read_text() == (tmp_path / "runs" / "compare.csv").read_text()
    assert main(["compare", str(a), str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_head_ablation_with_a_no_head_arm_gets_the_paired_cross_run_comparison(tmp_path, capsys):
    """Runs whose heads are identity (no head) vs an MLP, seeds 0 and 1: compare writes cross_run.json with the
    answers `headprobe claims` gives across runs (the same numbers), shows them in compare.html and prints their
    lines."""
    import json

    import torch

    from headprobe.stats.bootstrap import PerUnit, save_per_unit
    from headprobe.stats.cross_run import cross_run_answers

    runs = []
    for seed in (0, 1):
        for name, heads, shift in (("none", [{"name": "head", "type": "identity"}], 0.0),
                                   ("mlp", [{"name": "head", "type": "mlp", "depth": 2, "act": "relu",
                                             "bn_hidden": True}], 0.5)):
            path = tmp_path / f"{name}-{seed}"
            (path / "per_unit").mkdir(parents=True)
            values = torch.tensor([0.0, 1.0] * 10, dtype=torch.float64)
            save_per_unit(path / "per_unit" / "backbone.safetensors",
                          {"rotation.acc": PerUnit((values + shift).clamp(max=1.0), "test images")})
            (path / "results.json").write_text(json.dumps({
                "schema_version": 3,
                "status": "complete", "recipe": {"seed": seed, "heads": heads}, "data": {"source": "x", "n_test": 20},
                "protocol": {"views_probed": {"seed": seed}},
                "taps": {"backbone": {"metrics": {"rotation.acc": float(((values + shift).clamp(max=1.0)).mean())}}}}))
            runs.append(path)
    written = write_compare(runs, tmp_path)
    paired = json.loads(written["cross_run"].read_text())
    rot = paired["across"]["Q-aug"]["arms"]["mlp d2 relu bn"]
    assert rot["change"] == pytest.approx(0.25) and rot["n_seeds"] == 2 and rot["n_units"] == 20
    assert rot == json.loads(json.dumps(cross_run_answers(runs)["across"]["Q-aug"]["arms"]["mlp d2 relu bn"]))
    html = written["html"].read_text()
    assert "Across runs: no head vs each arm" in html and "backbone · rotation.acc" in html
    assert main(["compare", *map(str, runs), "--out", str(tmp_path / "out")]) == 0
    assert rot["line"] in capsys.readouterr().out


def test_compare_in_a_log_prints_the_whole_table_with_short_run_labels_and_their_legend(tmp_path, capsys):
    """A sweep's run folders ("heads.0.type=identity,seed=0") are columns named by what tells them apart, with a
    legend (name, label, folder, recipe); not on a terminal (capsys) the table is as wide as it needs, so no metric
    or tap name is cut; --width sets the width, and runs that do not fit go to a second table, names whole."""
    long = [write_run(tmp_path / f"heads.0.type={kind},seed=0", results_dict(), records=[])
            for kind in ("identity", "mlp")]
    assert main(["compare", *map(str, long), "--out", str(tmp_path / "out")]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if "metric" in line and "tap" in line)
    assert re.findall(r"type=\w+", header) == ["type=identity", "type=mlp"]
    legend = [line for line in lines if str(long[0]) in line or str(long[1]) in line]
    assert len(legend) == 2 and all("synthetic" in line for line in legend)  # the recipe's name
    assert "type=identity" in legend[0] and long[0].name in legend[0]
    metrics = set(results_dict()["taps"]["backbone"]["metrics"])
    assert "mi.infonce.ceiling" in metrics and not any("…" in line for line in lines)
    assert all(any(f" {m} " in line for line in lines) for m in metrics)  # every metric name whole
    short = _ablation_pair(tmp_path / "runs")
    assert main(["compare", *map(str, short), "--width", "60", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line[:1] in "┃│┏┡└"]
    assert table and "depth2" in "".join(table) and "…" not in out
    tables = out.split("\nruns", 1)[0].split("\n", 1)[1]  # the compare tables, without the legend under them
    assert max(len(line) for line in tables.splitlines()) <= 60 and tables.count("headprobe compare") >= 2
    assert "mi.infonce.ceiling" in out


def test_compare_through_a_pipe_never_wraps_at_80_columns(tmp_path):
    """The real non-terminal case: `headprobe compare` with its stdout a pipe (a log file, `| tee`)."""
    import subprocess
    import sys

    runs = [write_run(tmp_path / f"sweep/depth={d},activation=relu,seed=0", results_dict(), records=[])
            for d in (1, 2, 3)]
    out = subprocess.run([sys.executable, "-m", "headprobe", "compare", *map(str, runs), "--out",
                          str(tmp_path / "out")], capture_output=True, text=True, check=True).stdout
    assert "…" not in out and max(len(line) for line in out.splitlines()) > 80
    header = next(line for line in out.splitlines() if "metric" in line and "tap" in line)
    assert re.findall(r"depth=\d", header) == ["depth=1", "depth=2", "depth=3"]
    assert all(sum(str(r) in line for line in out.splitlines()) == 1 for r in runs)  # the legend's folders


def test_short_labels_keep_what_tells_runs_apart_else_number_them():
    from headprobe.report.table import short_labels

    assert short_labels(["a", "b"]) == {"a": "a", "b": "b"}
    assert short_labels(["s/lr=0.1,heads.0.depth=2", "s/lr=0.01,heads.0.depth=2"]) == {
        "s/lr=0.1,heads.0.depth=2": "lr=0.1", "s/lr=0.01,heads.0.depth=2": "lr=0.01"}
    many = ["x/" + "a" * 20, "x/" + "b" * 20]
    assert short_labels(many) == {many[0]: "R1", many[1]: "R2"}
