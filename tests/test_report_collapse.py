"""The report's collapse table (claim 4): counts over collapsed points per head, split by the largest share."""

from headprobe.report.collapse import collapse_rows, summarise_collapse
from headprobe.report.html import render_report
from headprobe.report.plots import Plot


def _point(head: str, source: str, step: int, collapsed: bool | None = True) -> dict:
    point = {"stage": "geometry", "head": head, "step": step, "curvature_source": source, "m_norm_ratio": 0.0 if
             head == "relu" else 0.5, "negative_loss_h": True, "out_std_uniform": 0.25}
    return point if collapsed is None else point | {"collapsed": collapsed}


RESULTS = {
    "heads": {"relu": {"config": {"type": "mlp", "act": "relu"}}, "swish": {"config": {"type": "mlp", "act": "swish"}},
              "plain": {"config": {"type": "mlp", "act": "gelu"}}},
    "protocol": {"train": {"collapse_start": {
        "relu": {"collapsed": True, "out_std": 0.001, "threshold": 0.025, "out_std_uniform": 0.25},
        "swish": {"collapsed": False, "out_std": 0.04, "threshold": 0.025, "out_std_uniform": 0.25}}}},
}
RECORDS = [
    _point("relu", "predictor_bn", 7), _point("relu", "none", 14), _point("relu", "objective", 21),
    _point("relu", "none", 28), _point("relu", "objective", 35, collapsed=False),
    _point("swish", "head", 7), _point("swish", "objective", 14), _point("swish", "head", 21, collapsed=False),
    {**_point("swish", "head", 28, collapsed=None), "out_std": 0.01},  # older record: out_std vs the step-0 threshold
    {**_point("swish", "head", 35, collapsed=None), "out_std": 0.03},
    {"stage": "geometry", "head": "plain", "step": 7, "lambda_min": -1.0},  # no split: not a collapse record
    {"stage": "train", "head": "relu", "step": 5, "out_std": 0.002},
    {"stage": "train", "head": "relu", "step": 30, "out_std": 0.01},
    {"stage": "train", "head": "swish", "step": 30, "out_std": 0.2},
]


def test_summary_counts_collapsed_points_only_by_largest_share_and_escape_from_collapse():
    summary = summarise_collapse(RESULTS, RECORDS)
    assert set(summary) == {"relu", "swish"}
    relu, swish = summary["relu"], summary["swish"]
    assert (relu["n_points"], relu["n_collapsed"], relu["negative"]) == (5, 4, 2)
    assert (relu["from_head"], relu["from_objective"], relu["from_predictor_bn"]) == (0, 1, 1)
    assert relu["negative_after_escape"] == 1 and relu["negative_frac"] == 0.5
    assert relu["answer"] == "λ_min < −bound at 2 of 4 collapsed points; the head's share the largest at 0"
    assert relu["collapsed_start"] is True and relu["out_std_end"] == 0.01 and relu["escaped"] is False
    assert relu["m_norm_ratio_median"] == 0.0 and relu["paper"].startswith("1/100")
    # swish: steps 7, 14 collapsed by flag; 28 by out_std 0.01 ≤ 0.025; 21 (flag) and 35 (0.03) after escape
    assert (swish["n_collapsed"], swish["negative"], swish["from_head"], swish["negative_after_escape"]) == (3, 3, 2, 2)
    assert (swish["escaped"], swish["collapsed_start"], swish["n_unknown"]) == (True, False, 0)
    assert swish["paper"].startswith("72/100")


def test_a_head_without_any_collapsed_point_says_so():
    records = [_point("relu", "objective", 7, collapsed=False)]
    relu = summarise_collapse(RESULTS, records)["relu"]
    assert relu["n_collapsed"] == 0 and relu["negative_frac"] is None
    assert relu["answer"] == "no collapsed point among 1 tracked"


def test_the_table_sits_in_the_geometry_section_and_is_absent_without_split_records():
    header, rows = collapse_rows(summarise_collapse(RESULTS, RECORDS))
    relu = next(row for row in rows if row[0] == "relu")
    assert header[3] == "largest share: head" and relu[1] == "2/4" and relu[-1].startswith("1/100")
    assert collapse_rows(summarise_collapse(RESULTS, [r for r in RECORDS if "curvature_source" not in r])) == (
        header, [])
    curves = Plot("lambda_over_training", "λ_min and λ_max over training", "geometry", error="not drawn here")
    page = render_report(RESULTS, [curves], RECORDS)
    geometry = page.split("<section id='geometry'>")[1].split("</section>")[0]
    assert "Collapse: where negative curvature comes from" in geometry
    assert "<td>relu</td><td>2/4</td>" in geometry and "72/100 epochs (Swish, collapsed)" in geometry


def test_a_results_json_carrying_the_old_html_collapse_table_renders_the_table_from_the_records():
    """Before 0.1.0's templates the table travelled as HTML under results["collapse_table"]; the page ignores that
    string (it is never placed as markup, nor shown as text) and builds the table from metrics.jsonl."""
    old = {**RESULTS, "collapse_table": "<h3>Collapse</h3><script>alert(1)</script><table><tr><td>stale</td></tr>"}
    page = render_report(old, [], RECORDS)
    geometry = page.split("<section id='geometry'>")[1].split("</section>")[0]
    assert "<script>" not in page and "stale" not in page and "&lt;script&gt;" not in page
    assert "<td>relu</td><td>2/4</td>" in geometry
