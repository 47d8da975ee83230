"""results.csv and the long compare.csv hold exactly the numbers of results.json, one row per metric."""

import csv
import json
import math

import pytest
from report_run import results_dict, write_run

from headprobe.record.directory import RunDir
from headprobe.record.tidy import TIDY_COLUMNS, results_csv
from headprobe.report.compare import write_compare


def _with_seeds_and_gaps() -> dict:
    """The synthetic run with two seeds at the head taps, an interval on some metrics and a NaN metric."""
    results = results_dict()
    results["taps"]["backbone"]["uncertainty"] = {"linear.acc": {"ci95": [0.93, 0.97], "method": "bootstrap"},
                                                  "rankme": {"ci95": None, "method": "no interval: ..."}}
    results["taps"]["backbone"]["metrics"]["cond"] = math.nan
    results["taps"]["mlp"]["seeds"] = {"0": {"metrics": {"linear.acc": 0.80, "rankme": 41.0}},
                                       "1": {"metrics": {"linear.acc": 0.82, "rankme": 39.0}}}
    return results


def _expected(results: dict) -> dict:
    """(tap, metric, seed) -> (head, depth, value, low, high), read from results.json directly."""
    out = {}
    for tap, entry in results["taps"].items():
        for metric, value in entry["metrics"].items():
            ci = (entry.get("uncertainty", {}).get(metric) or {}).get("ci95") or [None, None]
            out[(tap, metric, "")] = (entry["head"], entry["depth"], value, *ci)
        for seed, record in entry.get("seeds", {}).items():
            for metric, value in record["metrics"].items():
                out[(tap, metric, seed)] = (entry["head"], entry["depth"], value, None, None)
    return out


def _cell(text: str):
    return None if text == "" else float(text)


def test_results_csv_is_written_with_results_json_and_holds_its_numbers(tmp_path):
    RunDir.create(tmp_path / "run").write_results(_with_seeds_and_gaps())
    on_disk = json.loads((tmp_path / "run" / "results.json").read_text())  # NaN stored as null
    with open(tmp_path / "run" / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == TIDY_COLUMNS
    expected = _expected(on_disk)
    got = {(r["tap"], r["metric"], r["seed"]): (r["head"] or None, int(r["depth"]), _cell(r["value"]),
                                                _cell(r["low"]), _cell(r["high"])) for r in rows}
    assert len(rows) == len(got) == len(expected)  # one row per metric, none twice
    assert got == expected  # every value, interval end, head and depth equal to results.json's (full precision)
    assert got[("backbone", "linear.acc", "")][2:] == (0.95, 0.93, 0.97)
    assert got[("backbone", "cond", "")][2] is None  # NaN: an empty cell
    assert got[("mlp", "rankme", "1")] == ("mlp", 2, 39.0, None, None)
    assert got[("backbone", "mi.infonce.ceiling", "")][2] == math.log(256)


def test_results_csv_is_one_pandas_read_away(tmp_path):
    pd = pytest.importorskip("pandas")
    results = _with_seeds_and_gaps()
    (tmp_path / "results.csv").write_text(results_csv(json.loads(json.dumps(results).replace("NaN", "null"))))
    table = pd.read_csv(tmp_path / "results.csv")
    assert list(table.columns) == list(TIDY_COLUMNS)
    means = table[table.seed.isna()]
    row = means[(means.tap == "mlp") & (means.metric == "linear.acc")].iloc[0]
    assert (row["value"], row["head"], row["depth"]) == (0.81, "mlp", 2)
    per_seed = table[(table.tap == "mlp") & (table.metric == "linear.acc") & table.seed.notna()]
    assert sorted(per_seed.value) == [0.80, 0.82] and sorted(per_seed.seed) == [0, 1]
    assert table[(table.tap == "backbone") & (table.metric == "linear.acc")][["low", "high"]].values.tolist() == [
        [0.93, 0.97]]


def test_compare_csv_is_long_with_a_run_column(tmp_path):
    pd = pytest.importorskip("pandas")
    a, b = results_dict(), _with_seeds_and_gaps()
    b["taps"]["mlp"]["metrics"]["linear.acc"] = 0.77
    written = write_compare([write_run(tmp_path / "relu", a, records=[]), write_run(tmp_path / "swish", b,
                                                                                  records=[])], tmp_path)
    table = pd.read_csv(written["csv"])
    assert list(table.columns) == ["run", *TIDY_COLUMNS]
    assert sorted(set(table.run)) == ["relu", "swish"]
    for label, results in (("relu", a), ("swish", json.loads(json.dumps(b).replace("NaN", "null")))):
        mine = table[table.run == label]
        assert len(mine) == len(_expected(results))
        for (tap, metric, seed), (_, _, value, low, high) in _expected(results).items():
            row = mine[(mine.tap == tap) & (mine.metric == metric)
                       & (mine.seed.isna() if seed == "" else mine.seed == int(seed))]
            assert len(row) == 1
            got = [None if pd.isna(x) else x for x in row[["value", "low", "high"]].iloc[0]]
            assert got == [value, low, high]
    means = table[table.seed.isna()]
    wide = means.pivot(index=["tap", "metric"], columns="run", values="value")  # the old side-by-side view
    assert wide.loc[("mlp", "linear.acc")].tolist() == [0.81, 0.77]
