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
    _point("swish", "head", 28), _point("swish", "head", 35, collapsed=False),
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
    # swish: steps 7, 14 and 28 collapsed; 21 and 35 after escape
    assert (swish["n_collapsed"], swish["negative"], swish["from_head"], swish["negative_after_escape"]) == (3, 3, 2, 2)
    assert (swish["escaped"], swish["collapsed_start"], swish["n_unknown"]) == (True, False, 0)
    assert swish["paper"].startswith("72/100")


def test_a_point_without_the_collapsed_flag_is_unknown_whatever_its_out_std():
    records = [{**_point("relu", "head", 7, collapsed=None), "out_std": 0.001}]
    relu = summarise_collapse(RESULTS, records)["relu"]
    assert (relu["n_points"], relu["n_collapsed"], relu["n_unknown"]) == (1, 0, 1)


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


def _tracked(step: int, lambda_min: float, collapsed: bool) -> dict:
    return _point("swish", "head" if lambda_min < 0 else "none", step, collapsed) | {
        "lambda_min": lambda_min, "lambda_max": 2.0}


def test_escape_drive_is_lr_times_negative_curvature_times_steps_to_the_next_point():
    """Σ lr·|λ_min|·Δsteps over the collapsed points, with the schedule's lr of the last training record before each
    point: whether the curvature can explain an escape (scratch_collapse's 3e-7 · 0.05 · 32 cannot)."""
    records = [_tracked(0, -0.5, True), _tracked(10, 0.25, True), _tracked(20, -1.0, True),
               _tracked(30, -4.0, False), {"stage": "train", "head": "swish", "step": 1, "lr": 0.1},
               {"stage": "train", "head": "swish", "step": 15, "lr": 0.01},
               {"stage": "train", "head": "swish", "step": 40, "lr": 0.01, "out_std": 0.2}]
    scratch = RESULTS | {"recipe": {"backbone": {"id": "scratch:resnet18"}, "train": {"lr": 0.5}}}
    swish = summarise_collapse(scratch, records)["swish"]
    # step 0: no record before it, the recipe's 0.5 · 0.5 · 10; step 20: 0.01 · 1.0 · 10; step 10 positive
    assert swish["escape_drive_sum"] == 0.5 * 0.5 * 10 + 0.01 * 1.0 * 10
    assert swish["escape_drive_max"] == 2.5 and swish["escape_step"] == 30
    assert swish["lambda_ratio_median"] == -0.25  # of −0.25, 0.125, −0.5
    assert swish["curvature_explains_escape"] == "yes (drive ≥ 1)"
    weak = [r | {"lambda_min": r["lambda_min"] * 1e-6} if "lambda_min" in r else r for r in records]
    assert summarise_collapse(scratch, weak)["swish"]["curvature_explains_escape"] == "no (drive ≪ 1)"
    frozen = RESULTS | {"recipe": {"backbone": {"id": "offline:dinov2-vits14", "tune": "frozen"}, "train": {}}}
    assert summarise_collapse(frozen, records)["swish"]["curvature_explains_escape"].startswith("no (frozen")
    stays = [r for r in records if r.get("step") != 30]
    assert summarise_collapse(scratch, stays)["swish"]["curvature_explains_escape"] is None
    header, rows = collapse_rows(summarise_collapse(scratch, records))
    assert rows[0][header.index("curvature explains escape")] == "yes (drive ≥ 1)"
