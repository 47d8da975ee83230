"""The heat-map (headprobe/report/heatmap.py): its colour is the change from the backbone divided by its 95% interval
(a rise is a rise), its mark the same change signed by the buffer claim's predicted direction (✓ for, ✗ against),
computed here by hand for each case."""

import math

import numpy as np
import pytest

from headprobe.report.heatmap import claim_change, claim_marks, direction_change, plot_tap_heatmap, tap_heatmap


def _tap(head, metrics, intervals=None):
    return {"head": head, "depth": 0 if head is None else 1, "metrics": metrics,
            "uncertainty": {m: {"ci95": ci} for m, ci in (intervals or {}).items()}}


def _results():
    return {
        "taps": {
            "backbone": _tap(None, {"linear.acc": 0.90, "align": 0.39, "view_spread_rel": 0.30,
                                    "aug_r2.jitter_order": 0.0093, "linear.C": 1.0, "mi.infonce": 0.5},
                             {"linear.acc": [0.86, 0.94], "view_spread_rel": [0.28, 0.32]}),
            "h@1": _tap("h", {"linear.acc": 0.88, "align": 0.70, "view_spread_rel": 0.20,
                              "aug_r2.jitter_order": 0.00045, "linear.C": 10.0, "mi.infonce": 0.8},
                        {"linear.acc": [0.85, 0.91], "view_spread_rel": [0.17, 0.23]}),
            "h": _tap("h", {"linear.acc": 0.80, "align": 0.75, "view_spread_rel": 0.25, "mi.infonce": 0.4},
                      {"linear.acc": [0.75, 0.85]}),
        },
        "buffer": {"h": {"evidence": {"linear.acc": {"margin": 0.10, "ci95": [0.06, 0.14]}}}},
    }


def test_change_is_signed_by_the_claim_and_scaled_by_the_interval():
    metrics, taps, values, change, scaled = claim_change(_results())
    assert "linear.C" not in metrics  # protocol values are not in the heat-map
    assert taps == ["backbone", "h@1", "h"]
    row = {m: i for i, m in enumerate(metrics)}
    acc, spread = row["linear.acc"], row["view_spread_rel"]
    # linear.acc: the claim predicts lower at the head (−1). Hidden tap: both taps' intervals, half-widths in quadrature
    assert change[acc, 1] == pytest.approx(-(0.88 - 0.90) / math.hypot(0.03, 0.04)) and scaled[acc, 1]
    # head output: the verdict's own paired interval of the margin (half-width 0.04)
    assert change[acc, 2] == pytest.approx(0.10 / 0.04) and scaled[acc, 2]
    # view_spread_rel: predicted lower (−1), so a fall is positive (green)
    assert change[spread, 1] == pytest.approx(0.10 / math.hypot(0.03, 0.02))
    # no interval at the output: the change in the metric's own units, not scaled
    assert change[spread, 2] == pytest.approx(0.05) and not scaled[spread, 2]
    # mi.infonce: predicted higher (+1), no intervals
    assert change[row["mi.infonce"], 1] == pytest.approx(0.3) and change[row["mi.infonce"], 2] == pytest.approx(-0.1)


def test_the_colour_is_the_direction_and_the_mark_the_claim():
    results = _results()
    metrics, _, _, change, scaled = direction_change(results)
    row = {m: i for i, m in enumerate(metrics)}
    acc = row["linear.acc"]
    # the head's accuracy fell: negative (purple), whatever the claim predicts; the verdict's half-width 0.04
    assert change[acc, 2] == pytest.approx(-0.10 / 0.04) and scaled[acc, 2]
    assert change[row["align"], 2] == pytest.approx(0.75 - 0.39)  # a description has a direction too
    marks = claim_marks(results)
    # linear.acc fell by 2.5 half-widths as the claim predicts; at h@1 by 0.4 (within the interval): no mark
    assert marks[acc, 2] == "✓" and marks[acc, 1] == ""
    # view_spread_rel fell at h@1 by 0.10 / hypot(0.03, 0.02) = 2.8 half-widths (predicted lower): ✓; no interval
    # at the output: no mark
    assert marks[row["view_spread_rel"], 1] == "✓" and marks[row["view_spread_rel"], 2] == ""
    results["taps"]["h"]["metrics"]["linear.acc"] = 0.99  # a gain of 0.09 at the output: against the claim
    assert claim_marks(results)[acc, 2] == "✗" and direction_change(results)[3][acc, 2] > 0
    assert (claim_marks(results)[row["align"]] == "").all()


def test_a_negative_infonce_is_not_coloured():
    results = _results()
    results["taps"]["h"]["metrics"]["mi.infonce"] = -0.087  # the critic does worse than chance at the output
    metrics, _, _, change, _ = claim_change(results)
    row = change[metrics.index("mi.infonce")]
    assert row[1] == pytest.approx(0.3) and math.isnan(row[2])


def test_descriptions_and_the_backbone_column_are_neutral():
    metrics, _, values, change, _ = claim_change(_results())
    assert np.isnan(change[:, 0]).all()
    for metric in ("align", "aug_r2.jitter_order"):  # raw align rose: no colour (it is not evidence)
        assert np.isnan(change[metrics.index(metric)]).all()
    jitter = metrics.index("aug_r2.jitter_order")
    assert values[jitter, 1] == 0.00045 and math.isnan(values[jitter, 2])  # measured values are still shown


def test_a_near_zero_metric_does_not_swing(monkeypatch):
    # a hypothetical evidence metric at 0.0093 → 0.00045 without interval: −95% as a percentage, 0.009 in units
    import headprobe.stats.verdict

    monkeypatch.setattr(
        headprobe.stats.verdict, "predicted_change", lambda m: -1 if m == "aug_r2.jitter_order" else None
    )
    metrics, _, _, change, _ = claim_change(_results())
    assert change[metrics.index("aug_r2.jitter_order"), 1] == pytest.approx(0.0093 - 0.00045)


def test_heatmap_is_drawn(tmp_path):
    path = plot_tap_heatmap(_results(), tmp_path / "h.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no metrics"):
        plot_tap_heatmap({"taps": {"backbone": _tap(None, {"linear.C": 1.0})}}, tmp_path / "e.png")


@pytest.mark.parametrize("n_metrics", [1, 40])
def test_the_title_and_colour_bar_label_lie_inside_the_saved_figure(n_metrics, tmp_path):
    """One metric at two taps is the smallest heat-map (its long label ran past top and bottom, the title past both
    sides); forty metrics the tallest."""
    from PIL import Image

    from headprobe.report.canvas import DPI, save

    metrics = {f"aug_r2.p{i}": 0.5 + i / 100 for i in range(n_metrics)}
    results = {"taps": {"backbone": _tap(None, metrics), "h": _tap("h", {m: v - 0.1 for m, v in metrics.items()})}}
    fig = tap_heatmap(results)
    path = save(fig, tmp_path / "h.png")
    fig.set_dpi(DPI)  # lay out and measure at the resolution of the file
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    colour_bar = next(ax for ax in fig.axes if ax.get_label() == "<colorbar>")
    texts = {"title": fig.get_suptitle().replace("\n", " "), "label": colour_bar.get_ylabel().replace("\n", " ")}
    assert texts["title"].startswith("Every metric at every tap") and texts["label"].startswith("change vs backbone")
    boxes = {"title": fig._suptitle.get_window_extent(renderer),
             "label": colour_bar.yaxis.label.get_window_extent(renderer)}
    with Image.open(path) as image:
        width, height = image.size
    assert (width, height) == (round(fig.get_figwidth() * DPI), round(fig.get_figheight() * DPI))
    for name, box in boxes.items():
        assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= width and box.y1 <= height, (name, box)
