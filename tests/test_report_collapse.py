"""The report's collapse table (claim 4): counts per head, split by where negative curvature comes from."""

from headprobe.report.collapse import collapse_section, summarise_collapse
from headprobe.report.html import render_report
from headprobe.report.plots import Plot


def _point(head: str, source: str, step: int) -> dict:
    return {"stage": "geometry", "head": head, "step": step, "curvature_source": source, "m_norm_ratio": 0.0 if
            head == "relu" else 0.5, "negative_loss_h": True, "out_std_uniform": 0.25}


RESULTS = {
    "heads": {"relu": {"config": {"type": "mlp", "act": "relu"}}, "swish": {"config": {"type": "mlp", "act": "swish"}},
              "plain": {"config": {"type": "mlp", "act": "gelu"}}},
    "protocol": {"train": {"collapse_start": {
        "relu": {"collapsed": True, "out_std": 0.001, "threshold": 0.025, "out_std_uniform": 0.25},
        "swish": {"collapsed": False, "out_std": 0.04, "threshold": 0.025, "out_std_uniform": 0.25}}}},
}
RECORDS = [
    _point("relu", "loss", 7), _point("relu", "none", 14), _point("relu", "loss", 21), _point("relu", "none", 28),
    _point("swish", "head", 7), _point("swish", "loss", 14),
    {"stage": "geometry", "head": "plain", "step": 7, "lambda_min": -1.0},  # no split: not a collapse record
    {"stage": "train", "head": "relu", "step": 5, "out_std": 0.002},
    {"stage": "train", "head": "relu", "step": 30, "out_std": 0.01},
    {"stage": "train", "head": "swish", "step": 30, "out_std": 0.2},
]


def test_summary_counts_negative_points_by_source_and_escape_from_collapse():
    summary = summarise_collapse(RESULTS, RECORDS)
    assert set(summary) == {"relu", "swish"}
    relu, swish = summary["relu"], summary["swish"]
    assert (relu["n_points"], relu["negative"], relu["from_loss"], relu["from_head"]) == (4, 2, 2, 0)
    assert relu["negative_frac"] == 0.5 and relu["from_loss_frac"] == 0.5 and relu["from_head_frac"] == 0.0
    assert relu["collapsed_start"] is True and relu["out_std_end"] == 0.01 and relu["escaped"] is False
    assert relu["m_norm_ratio_median"] == 0.0 and relu["paper"].startswith("1/100")
    assert (swish["negative"], swish["from_head"], swish["escaped"], swish["collapsed_start"]) == (2, 1, True, False)
    assert swish["paper"].startswith("72/100")


def test_the_table_sits_in_the_geometry_section_and_is_absent_without_split_records():
    html = collapse_section(RESULTS, RECORDS)
    assert "from the head" in html and "2/4" in html and "72/100" in html
    assert collapse_section(RESULTS, [r for r in RECORDS if "curvature_source" not in r]) == ""
    curves = Plot("lambda_over_training", "λ_min and λ_max over training", "geometry", error="not drawn here")
    page = render_report({**RESULTS, "collapse_table": html}, [curves])
    geometry = page.split("<section id='geometry'>")[1].split("</section>")[0]
    assert "Collapse: where negative curvature comes from" in geometry
