"""Every number of report.html and the terminal summary reads right, for a run with every kind of answer (yes, no,
undecided, undecided by Holm's correction alone, equivalent, lost, gained, not measured): one unit per row (an
accuracy, its change and its interval all in percent / points), each printed interval agrees with its answer or the
line says the Holm-adjusted p it was decided on, no interval on a chosen hyper-parameter, no stray strings.

The answers come from `stats.claims.answer_questions` on per-seed values (t intervals over 3 seeds); what each
should be is worked out here from the changes chosen."""

from __future__ import annotations

import html
import io
import re

import pytest
from report_run import results_dict
from rich.console import Console

from headprobe.report.html import render_report
from headprobe.report.table import print_summary
from headprobe.stats.answers import claims_record
from headprobe.stats.claims import QUESTIONS, answer_questions
from headprobe.stats.measures import tap_measures

# Per head, the per-seed change head − backbone of rotation.acc (Q-aug, predicted lower, margin 0) and of linear.acc
# (Q-class, equivalence within ±0.02), and the answers they must give (worked out by hand; "holm": t p ≈ 0.049
# before the correction, doubled or more by it across four heads).
CHANGES = {
    "d1": ((-0.10, -0.09, -0.11), (-0.005, -0.004, -0.006)),
    "d2": ((0.10, 0.09, 0.11), (-0.10, -0.09, -0.11)),
    "d3": ((-0.01, 0.02, -0.03), (0.10, 0.09, 0.11)),
    "head": ((-0.03, -0.05, -0.07), (-0.03, 0.0, 0.03)),
}
EXPECTED = {"Q-aug": {"d1": "yes", "d2": "no", "d3": "undecided", "head": "undecided"},
            "Q-class": {"d1": "equivalent", "d2": "lost", "d3": "gained", "head": "undecided"}}
BACKBONE = {"rotation.acc": 0.80, "linear.acc": 0.90, "knn.k10.acc": 0.8867, "rotation45.orbit.spread_rel": 0.5,
            "linear.C": 1.0}
NUMBER = r"[−+]?\d+(?:\.\d+)?(?:e[−+]?\d+)?"


def _results() -> dict:
    results = results_dict()
    results.pop("orbits")
    taps = {"backbone": {"head": None, "depth": 0, "metrics": dict(BACKBONE)}}
    for head, (rotation, linear) in CHANGES.items():
        seeds = {str(s): {"metrics": {"rotation.acc": 0.80 + rotation[s], "linear.acc": 0.90 + linear[s],
                                      "knn.k10.acc": 0.9052 + 0.001 * s, "rotation45.orbit.spread_rel": 0.4,
                                      "linear.C": 10.0 * (1 + 3 * s)}} for s in range(3)}
        mean = {m: sum(r["metrics"][m] for r in seeds.values()) / 3 for m in seeds["0"]["metrics"]}
        # linear.C varies over the seeds (10, 40, 70): an interval over them would read "40 ±129"
        taps[head] = {"head": head, "depth": 1, "metrics": mean, "seeds": seeds,
                      "uncertainty": {"linear.C": {"ci95": [-89.0, 169.0]}}}
    results["taps"] = taps
    results["heads"] = {h: {"train": {"steps": 40, "status": "complete"}} for h in CHANGES}
    results["buffer"] = {}
    results["claims"] = claims_record(answer_questions(tap_measures(taps), {}, {h: h for h in CHANGES}))
    return results


def _interval_agrees(question: str, answer: str, low: float, high: float, margin: float) -> bool:
    """Whether [low, high] (in the line's units) shows `answer` by itself, as the rules of `stats.claims` read it."""
    if question == "Q-aug":  # predicted lower, margin 0 (in points here)
        return {"yes": high < -margin, "no": low > margin}.get(answer, low <= -margin <= high or low <= margin <= high)
    return {"equivalent": -margin < low and high < margin, "lost": high < -margin, "gained": low > margin}.get(
        answer, low <= -margin <= high or low <= margin <= high)


@pytest.fixture(scope="module")
def report():
    results = _results()
    return results, html.unescape(render_report(results, []))


def test_every_answer_kind_is_there_and_as_worked_out(report):
    results, _ = report
    claims = results["claims"]
    for key, heads in EXPECTED.items():
        assert {h: claims[key]["heads"][h]["answer"] for h in heads} == heads
    holm = claims["Q-aug"]["heads"]["head"]
    assert holm["p"] < 0.05 <= holm["p_holm"]  # undecided by the correction alone
    assert claims["Q-inv"]["heads"]["d1"]["answer"] == "not measured"


def test_no_printed_interval_contradicts_its_answer(report):
    results, text = report
    lines = [line for c in results["claims"].values() for line in
             (r.get("line") for r in c["heads"].values()) if line and "was not measured" not in line]
    assert len(lines) == 8
    for line in lines:
        question, answer = line.split(":")[0], line.rsplit(" — ", 1)[1].split(" (")[0]
        low, high = (float(x.replace("−", "-")) for x in re.search(rf"\[({NUMBER}), ({NUMBER})\]", line).groups())
        margin = 100 * QUESTIONS[question].margin
        if not _interval_agrees(question, answer, low, high, margin):
            assert re.search(r"\(p [\d.e−-]+; Holm-adjusted across the question's heads [\d.e−-]+, resolved only "
                             r"below α = 0\.05\)$", line), line
        assert line in text  # the report shows each line as written
    holm_line = results["claims"]["Q-aug"]["heads"]["head"]["line"]
    assert "Holm-adjusted" in holm_line and not _interval_agrees("Q-aug", "undecided", -9.97, -0.03, 0.0)


def test_each_row_has_one_unit(report):
    results, text = report
    summary = text[text.index("<section id='summary'>"):text.index("<section id='answers'>")]
    record = results["claims"]["Q-aug"]["heads"]["d1"]
    # backbone / head (Δ [95% interval]): all in percent and points
    expected = (f"80.0 / {100 * record['head']:.1f} ({100 * record['change']:+.1f} "
                f"[{100 * record['ci95'][0]:.1f}, {100 * record['ci95'][1]:.1f}], 3 seeds)").replace("-", "−")
    assert f"<td class='num'>{expected}</td>" in summary
    answers = text[text.index("<section id='answers'>"):]
    knn = results["claims"]["Q-class"]["heads"]["d1"]["secondary"]["knn.k10.acc"]
    row = re.search(r"<tr><th>knn\.k10\.acc</th><td>([^<]*)</td>((?:<td class='num'>[^<]*</td>){4})", answers)
    cells = re.findall(r"<td class='num'>([^<]*)</td>", row.group(2))
    want = [f"{100 * knn['backbone']:.1f}", f"{100 * knn['head']:.1f}", f"{100 * knn['change']:+.1f}",
            f"[{100 * knn['ci95'][0]:.1f}, {100 * knn['ci95'][1]:.1f}]"]
    assert row.group(1) == "percent; change in points"
    assert cells == [w.replace("-", "−") for w in want]  # 88.7 | 90.6 | +1.9 | [...]: never 0.8867 beside points
    spread = re.search(r"<tr><th>rotation45\.orbit\.spread_rel</th><td>([^<]*)</td>", answers)
    assert spread.group(1) == "the measure's own; change likewise"


def test_no_stray_strings_and_no_head_head(report):
    results, text = report
    assert "p —" not in text and "Holm —" not in text  # a "not measured" head has no p to show
    assert "head head" not in text
    assert results["claims"]["Q-class"]["heads"]["head"]["line"].startswith("Q-class: head keeps the class")
    assert results["claims"]["Q-class"]["heads"]["d1"]["line"].startswith("Q-class: d1 head keeps the class")


def test_a_chosen_hyper_parameter_has_no_interval_in_the_terminal(report):
    results, _ = report
    console = Console(file=io.StringIO(), width=300, color_system=None)
    print_summary(results, console=console)
    row = next(line for line in console.file.getvalue().splitlines() if "linear.C" in line)
    assert "±" not in row and "40.0000" in row


def test_each_questions_margin_is_in_its_answer_lines_units(report):
    _, text = report
    answers = text[text.index("<section id='answers'>"):]
    assert "primary linear.acc, predicted no change, margin 2.0 points." in answers
    assert "primary rotation.acc, predicted lower at the head, margin 0.0 points." in answers
    assert "margin 0.0200" not in answers
