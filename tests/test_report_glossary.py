"""The metric glossary (headprobe/report/glossary.py): chance levels, protocol values, tooltips, and that every
metric a probe writes has an entry."""

import pytest

from headprobe.report.glossary import describe_metric, is_protocol_value, metric_unit, tooltip
from headprobe.report.html import render_report


@pytest.mark.parametrize("metric, n_classes, chance", [
    ("linear.acc", 10, 0.1), ("knn.k20.acc", 10, 0.1), ("knn.k5.acc", 4, 0.25), ("linear.acc", None, None),
    ("rotation.acc", 10, 0.25), ("rotation.mlp.acc", 100, 0.25), ("mi.infonce", 10, 0.0),
    ("hue.orbit.spread_rel", 10, 0.5), ("rankme", 10, None),
])
def test_chance_levels(metric, n_classes, chance):
    assert describe_metric(metric, n_classes).chance == chance


@pytest.mark.parametrize("metric, protocol", [
    ("linear.C", True), ("linear.val_acc", True), ("mi.infonce.ceiling", True), ("linear.acc", False),
    ("knn.k20.acc", False), ("rotation.acc", False), ("mi.infonce", False),
])
def test_protocol_values_are_told_apart_from_measurements(metric, protocol):
    assert is_protocol_value(metric) is protocol


def test_every_metric_the_probes_write_is_described():
    # the names the registered probes write (declared in headprobe/probes/builtin/), as in a real run's results
    names = ["linear.acc", "linear.val_acc", "linear.C", "mi.label", "knn.k5.acc", "knn.k20.acc", "rankme",
             "alpha_req", "cond", "eff_rank", "align", "uniform", "view_cos", "lidar", "view_spread_rel",
             "mi.infonce", "mi.infonce.ceiling", "mi.gaussian", "aug_r2.mean", "aug_r2.crop_scale", "rotation.acc",
             "rotation.mlp.acc"] + [f"rotation360.orbit.{m}" for m in (
                 "spread", "spread_rel", "d_intra", "d_inter", "d_ratio", "d_inter_image", "d_ratio_image",
                 "pair_sq_dist", "pair_dist", "d_intra_rel", "curvature", "cos_anchor", "eff_rank")]
    for name in names:
        info = describe_metric(name, 10)
        assert info is not None and info.meaning and info.unit and info.direction, name
    assert describe_metric("no.such.metric") is None
    assert "rotation360 sweep" in describe_metric("rotation360.orbit.spread_rel").meaning


def test_tooltip_and_table_say_meaning_unit_direction_and_chance():
    text = tooltip("knn.k20.acc", 10)
    assert text.startswith("knn.k20.acc: test accuracy of a weighted 20-nearest-neighbour vote")
    assert "unit: fraction of test images" in text and "higher = more class information" in text
    assert text.endswith("chance 0.1")
    assert "critic uninformative" in tooltip("mi.infonce")
    assert tooltip("x.y") == "x.y: not in the glossary (see the probe's docstring)"
    assert metric_unit("rankme") == "effective rank (dims)" and metric_unit("x.y") == "value"
    taps = {"backbone": {"head": None, "metrics": {"linear.acc": 0.9, "x.y": 1.0, "a<b": 2.0}}}
    page = render_report({"data": {"n_classes": 10}, "taps": taps}, [])
    html = page.split("<table class='glossary'>")[1].split("</table>")[0]  # the glossary as the report renders it
    assert "<th>linear.acc</th>" in html and "<td class='num'>0.1</td>" in html
    assert html.count("not in the glossary") == 2 and "a&lt;b" in html
