"""`headprobe claims` (headprobe/report/claims_table.py, cli.py): the paper's layout z / h(z) (Δ [95% CI], n) in
Markdown, LaTeX and CSV, with the numbers of results.json."""

import csv
import io
import json
import re

import pytest

from headprobe import run
from headprobe.cli import main
from headprobe.report.claims_table import claims_rows, format_claims, paper_cell
from headprobe.stats.answers import claims_record
from headprobe.stats.claims import answer_questions
from headprobe.stats.measures import tap_measures


def _results() -> dict:
    taps = {"backbone": {"metrics": {"rotation.acc": 0.85, "linear.acc": 0.97, "knn.k20.acc": 0.9}}}
    seeds = {str(i): {"metrics": {"rotation.acc": 0.85 + c, "linear.acc": 0.97 + c / 10, "knn.k20.acc": 0.9 - c}}
             for i, c in enumerate((-0.07, -0.05, -0.09))}
    taps["d2"] = {"head": "d2", "seeds": seeds,
                  "metrics": {m: sum(s["metrics"][m] for s in seeds.values()) / 3 for m in seeds["0"]["metrics"]}}
    return {"claims": claims_record(answer_questions(tap_measures(taps), {}, {"d2": "d2"}))}


def test_csv_holds_the_numbers_of_results_json_unrounded():
    results = _results()
    rows = list(csv.DictReader(io.StringIO(format_claims(claims_rows({"r": results}, secondary=True), "csv"))))
    primary = [r for r in rows if r["role"] == "primary" and r["answer"] != "not measured"]
    assert [(r["question"], r["measure"]) for r in primary] == [("Q-aug", "rotation.acc"), ("Q-class", "linear.acc")]
    assert [(r["question"], r["head"]) for r in rows if r["answer"] == "not measured"] == [("Q-inv", "—")]
    for row in primary:
        record = results["claims"][row["question"]]["heads"]["d2"]
        assert float(row["backbone"]) == record["backbone"] and float(row["head_value"]) == record["head"]
        assert float(row["change"]) == record["change"]
        assert [float(row["ci_low"]), float(row["ci_high"])] == record["ci95"]
        assert float(row["p_holm"]) == record["p_holm"] and row["answer"] == record["answer"]
        assert (int(row["n_seeds"]), row["interval"]) == (3, "t over seeds")
    secondary = [r for r in rows if r["role"] == "secondary"]
    assert [(r["question"], r["measure"], r["answer"]) for r in secondary] == [("Q-class", "knn.k20.acc", "")]
    knn = results["claims"]["Q-class"]["heads"]["d2"]["secondary"]["knn.k20.acc"]
    assert float(secondary[0]["change"]) == knn["change"] and float(secondary[0]["ci_high"]) == knn["ci95"][1]


def test_markdown_and_latex_cells_are_the_paper_layout():
    results = _results()
    record = results["claims"]["Q-aug"]["heads"]["d2"]
    lo, hi = (f"{100 * v:.1f}".replace("-", "−") for v in record["ci95"])
    cell = f"85.0 / 78.0 (−7.0 [{lo}, {hi}], 3 seeds)"
    md = format_claims(claims_rows({"r": results}), "md")
    assert f"| Q-aug | rotation.acc | r | d2 | {cell} | {record['answer']} | — |" in md.splitlines()
    latex = format_claims(claims_rows({"run_1": results}), "latex")
    assert "run\\_1" in latex and "$-$7.0" in latex and "$\\Delta$ [95\\% CI]" in latex
    first, second = latex.splitlines()[:2]
    assert first.startswith("% ") and "\\usepackage{booktabs}" in first  # what the table needs, said in it
    assert second == "\\begin{tabular}{lllllll}" and latex.rstrip().endswith("\\end{tabular}")
    assert paper_cell({"measure": "view_spread_rel", "backbone": 0.21, "head_value": 0.15, "change": -0.06,
                       "ci95": [-0.09, -0.03], "n_seeds": 1, "n_units": 200}) == (
        "0.21 / 0.15 (−0.06 [−0.09, −0.03], 1×200)")


def test_a_run_without_answers_is_refused_with_a_sentence(tmp_path, capsys):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "results.json").write_text(json.dumps({"schema_version": 3, "status": "complete",
                                                                          "taps": {}}))
    assert main(["claims", str(tmp_path / "old")]) == 2
    assert "has no answers" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--format 'html' is not one of md, latex, csv"):
        format_claims([], "html")


@pytest.mark.slow
def test_the_claims_command_writes_the_numbers_of_a_real_run(tiny_recipe, tmp_path, capsys):
    recipe = {**tiny_recipe, "heads": [{"name": "relu", "act": "relu", "width": 16, "out_dim": 4}],
              "augment": {"preset": "crop-flip", "views": 2}, "train": {"epochs": 1, "batch_size": 50},
              "probes": {"linear": {"C_grid": [0.1, 1.0]}, "invariance": {}}}
    results = run(recipe, out=tmp_path / "r", quiet=True).data
    assert main(["claims", str(tmp_path / "r"), "--format", "csv", "--out", str(tmp_path / "t.csv")]) == 0
    rows = list(csv.DictReader((tmp_path / "t.csv").open()))
    assert [(r["question"], r["head"], r["answer"]) for r in rows if r["answer"] == "not measured"] == [
        ("Q-aug", "—", "not measured")]  # no rotation probe: the question keeps its row
    rows = [r for r in rows if r["answer"] != "not measured"]
    assert {(r["question"], r["head"]) for r in rows} == {("Q-inv", "relu"), ("Q-class", "relu")}
    assert all(r["trained"] and r["training"].startswith(r["trained"] + ":") for r in rows)
    for row in rows:
        record = results["claims"][row["question"]]["heads"]["relu"]
        assert float(row["change"]) == record["change"] and row["interval"] == "test images only"
        assert [float(row["ci_low"]), float(row["ci_high"])] == record["ci95"]
    assert main(["claims", str(tmp_path / "r")]) == 0
    md = capsys.readouterr().out
    record = results["claims"]["Q-class"]["heads"]["relu"]
    shown = re.search(r"\| Q-class \| linear\.acc \| r \| relu \| ([\d.]+) / ([\d.]+) \(", md)
    assert [float(v) for v in shown.groups()] == [round(100 * record["backbone"], 1), round(100 * record["head"], 1)]


def test_a_head_without_the_primary_keeps_a_not_measured_row_and_its_secondary_rows():
    taps = {"backbone": {"metrics": {"aug_r2.mean": 0.5}},
            "h": {"head": "h", "metrics": {"aug_r2.mean": 0.4}}}
    claims = claims_record(answer_questions(tap_measures(taps), {}, {"h": "h"}))
    rows = claims_rows({"r": {"claims": claims}}, secondary=True)
    assert [(r["question"], r["head"], r["measure"], r["role"], r["answer"]) for r in rows] == [
        ("Q-aug", "h", "rotation.acc", "primary", "not measured"), ("Q-aug", "h", "aug_r2.mean", "secondary", None),
        ("Q-inv", "—", "view_spread_rel", "primary", "not measured"),
        ("Q-class", "—", "linear.acc", "primary", "not measured")]
    md = format_claims(rows, "md")
    assert "0.5 / 0.4 (−0.1 [no interval], 1 seed)" in md
    assert "| Q-aug | rotation.acc | r | h | — | not measured | — |" in md.splitlines()
    assert md.rstrip().splitlines()[-1].startswith("trained: each head's loss curve")  # the footnote


def test_every_training_flag_reaches_every_format():
    results = _results()
    training = {"r": {"d2": "barely trained: loss fell from 21.47 to 20.77, over 40 logged steps"}}
    rows = claims_rows({"r": results}, training=training)
    assert [r["trained"] for r in rows if r["head"] == "d2"] == ["barely trained"] * 2
    table = [r for r in csv.DictReader(io.StringIO(format_claims(rows, "csv"))) if r["head"] == "d2"]
    assert [(r["trained"], r["training"]) for r in table] == [("barely trained", training["r"]["d2"])] * 2
    md = [line for line in format_claims(rows, "md").splitlines() if "| d2 |" in line]
    assert len(md) == 2 and all(line.endswith("| barely trained |") for line in md)
    assert format_claims(rows, "latex").count("& barely trained \\\\") == 2


@pytest.mark.parametrize("claims, words", [
    ({"Q-aug": "yes"}, "claims.Q-aug has no primary measure or no heads"),
    ({"Q-aug": {"primary": "rotation.acc", "heads": {"d2": {"change": None, "backbone": 0.5, "head": 0.4}}}},
     "claims.Q-aug.heads.d2 is not an answer with numbers"),
])
def test_damaged_claims_are_refused_with_a_sentence(claims, words, tmp_path, capsys):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.json").write_text(json.dumps({"schema_version": 3, "status": "complete",
                                                                        "claims": claims}))
    assert main(["claims", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and words in " ".join(err.split())


def test_geometry_answers_are_rows_with_their_value_interval_and_count():
    """Q-split and Q-saddle (kind: value) were "not measured" rows: the table read only changes."""
    from headprobe.geometry.saddle import SaddleState
    from headprobe.stats.geometry_claims import SplitMeasure, answer_saddle, answer_split

    def state(head, seed, index, negative):
        return SaddleState(head, seed, index, True, 1e-4, 1e-2, -1.0 if negative else 1.0, 2.0, 1e-15, negative,
                           -0.5 if negative else 0.0, True)

    split = answer_split([SplitMeasure("relu_bn", {0: [0.2, 0.3], 1: [0.25, 0.3]}, {0: [0.0, 0.0], 1: [0.0, 0.0]},
                                       False, True)])
    states = [state(h, s, i, h == "swish" and i != 0) for h in ("relu", "swish") for s in range(3) for i in range(20)]
    saddle = answer_saddle({"simsiam": states}, "sizes")
    rows = claims_rows({"r": {"claims": {"Q-split": split.to_record(), "Q-saddle": saddle.to_record()}}},
                      secondary=True)
    by = {(r["question"], r["head"], r["measure"]): r for r in rows}
    share = by[("Q-split", "relu_bn", "m_share.batch")]
    assert share["answer"] == "M > 0" and share["value"] == pytest.approx(0.2625)
    low, high = split.heads["relu_bn"].interval["ci95"]
    assert paper_cell(share) == f"0.263 [{low:.3g}, {high:.3g}] (2×2)"
    running = by[("Q-split", "relu_bn", "m_share.running")]
    assert running["role"] == "secondary" and running["answer"] == "M = 0" and running["value"] == 0
    swish = by[("Q-saddle", "swish", "negative_share.simsiam")]
    assert swish["answer"] == "saddle" and paper_cell(swish).endswith("(57/60 collapsed states, 3×20)")
    assert by[("Q-saddle", "relu", "negative_share.simsiam")]["answer"] == "not a saddle"
    assert not any(r["answer"] == "not measured" for r in rows)
    table = list(csv.DictReader(io.StringIO(format_claims(rows, "csv"))))
    csv_share = next(r for r in table if r["question"] == "Q-split" and r["role"] == "primary")
    assert float(csv_share["value"]) == share["value"] and float(csv_share["ci_low"]) == low
    assert "57/60" in format_claims(rows, "md") and "57/60" in format_claims(rows, "latex")


def test_an_undecided_answer_shows_its_raw_and_holm_p_and_others_do_not():
    """An interval inside the margin can still be undecided after Holm's correction across heads (the quickstart's
    lin_bn: +0.0 [−1.5, 1.5] points, p 0.028, Holm 0.055): the table says why in the answer cell."""
    from headprobe.report.claims_table import answer_cell

    assert answer_cell({"answer": "undecided", "p": 0.0276, "p_holm": 0.0552}) == "undecided (p 0.0276, Holm 0.0552)"
    assert answer_cell({"answer": "equivalent", "p": 0.01, "p_holm": 0.02}) == "equivalent"
    assert answer_cell({"answer": "undecided", "p": None, "p_holm": None}) == "undecided"
    assert answer_cell({"answer": None}) == "—"
    rows = claims_rows({"r": _results()})
    table = format_claims(rows, "md")
    for row in rows:
        if row.get("answer") == "undecided" and row.get("p") is not None:
            assert f"undecided (p {row['p']:.3g}, Holm {row['p_holm']:.3g})".replace("-", "−") in table
