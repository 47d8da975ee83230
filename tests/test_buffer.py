"""The buffer verdict: every sweep's spread is evidence, and only margins beyond the noise are resolved."""

import json
from pathlib import Path

import pytest
import torch

from headprobe.probes.builtin.invariance import INVARIANCE as invariance
from headprobe.probes.builtin.knn import KNN as knn
from headprobe.probes.builtin.linear import LINEAR as linear
from headprobe.probes.tap_data import TapData
from headprobe.stats.bootstrap import PerUnit, bootstrap_resamples
from headprobe.stats.measures import tap_measures
from headprobe.stats.verdict import buffer_verdict, predicted_change

pytestmark = pytest.mark.usefixtures("single_thread")


def taps(backbone: dict, head: dict) -> dict:
    return {"backbone": {"metrics": backbone}, "relu": {"metrics": head}}


def test_any_sweep_spread_is_its_own_piece_of_evidence():
    result = buffer_verdict(tap_measures(taps(
        {"linear.acc": 0.9, "rotation45.orbit.spread_rel": 0.30, "hue.orbit.spread_rel": 0.20,
         "saturation.orbit.spread_rel": 0.25, "rotation45.orbit.curvature": 1.0, "blur.orbit.spread_rel": 0.1},
        {"linear.acc": 0.8, "rotation45.orbit.spread_rel": 0.10, "hue.orbit.spread_rel": 0.25,
         "saturation.orbit.spread_rel": 0.25, "rotation45.orbit.curvature": 2.0},
    )), "relu")
    evidence = result.evidence
    assert set(evidence) == {"linear.acc", "rotation45.orbit.spread_rel", "hue.orbit.spread_rel",
                             "saturation.orbit.spread_rel"}
    assert evidence["rotation45.orbit.spread_rel"].margin == pytest.approx(0.20)  # lower at the head: as claimed
    assert evidence["hue.orbit.spread_rel"].margin == pytest.approx(-0.05)
    assert all(e.claim == "head more invariant" for k, e in evidence.items() if "orbit" in k)
    # Point estimates alone resolve nothing: without per-unit values there is no interval.
    assert result.verdict == "inconclusive" and result.unresolved == 4
    assert all(e.resolved == "unresolved" and e.ci95 is None and e.why_unresolved is not None
               for e in evidence.values())


def _paired(n: int, seed: int, head_gap: float) -> tuple[dict, dict]:
    """Per-image correctness of a backbone right 90% of the time and a head that drops `head_gap` of those."""
    g = torch.Generator().manual_seed(seed)
    backbone = (torch.rand(n, generator=g) < 0.9).double()
    head = backbone * (torch.rand(n, generator=g) >= head_gap).double()
    return ({"backbone": {"linear.acc": PerUnit(backbone, "test images")},
             "relu": {"linear.acc": PerUnit(head, "test images")}},
            {"backbone": {"metrics": {"linear.acc": float(backbone.mean())}},
             "relu": {"metrics": {"linear.acc": float(head.mean())}}})


def test_a_clear_paired_margin_is_resolved_and_a_tiny_one_is_not():
    resamples = {"test images": bootstrap_resamples(450, n_boot=2000, seed=0)}
    samples, tap_metrics = _paired(450, 0, head_gap=0.05)
    clear = buffer_verdict(tap_measures(tap_metrics, samples), "relu", resamples)
    entry = clear.evidence["linear.acc"]
    assert entry.resolved == "for" and clear.verdict == "buffer"
    assert entry.ci95[0] > 0 and entry.ci95[0] < entry.margin < entry.ci95[1]
    samples, tap_metrics = _paired(450, 1, head_gap=0.002)
    assert buffer_verdict(tap_measures(tap_metrics, samples), "relu", resamples).verdict == "inconclusive"


def test_the_head_doing_better_is_resolved_against():
    resamples = {"test images": bootstrap_resamples(450, n_boot=2000, seed=0)}
    samples, tap_metrics = _paired(450, 0, head_gap=0.05)
    samples = {"backbone": samples["relu"], "relu": samples["backbone"]}
    tap_metrics = {"backbone": tap_metrics["relu"], "relu": tap_metrics["backbone"]}
    out = buffer_verdict(tap_measures(tap_metrics, samples), "relu", resamples)
    assert out.verdict == "no-buffer" and out.evidence["linear.acc"].resolved == "against"


def _probe_all(x_train, y_train, x_test, y_test, views, name):
    tap = TapData(name, x_train, y_train, x_test, y_test, n_classes=int(y_train.max()) + 1, views=views)
    metrics, per_unit = {}, {}
    # The whitened linear probe is invariant to invertible linear maps (the standardised description is skipped).
    for probe, options in ((linear, {"standardized_probe": False, "C_grid": (0.1, 1.0)}), (knn, {}), (invariance, {})):
        out = probe(tap, **options)
        metrics |= out.metrics
        per_unit |= out.per_unit
    return {"metrics": metrics}, per_unit


def _world(seed: int, n_train=160, n_test=120, d=8):
    g = torch.Generator().manual_seed(seed)
    means = 1.5 * torch.randn(3, d, generator=g)
    y_train, y_test = torch.arange(n_train) % 3, torch.arange(n_test) % 3
    x_train = means[y_train] + torch.randn(n_train, d, generator=g)
    x_test = means[y_test] + torch.randn(n_test, d, generator=g)
    # Two views per image that differ along the last coordinate only: the nuisance direction.
    nuisance = torch.zeros(d)
    nuisance[-1] = 1.0
    views = x_train[:, None] + 2.0 * torch.randn(n_train, 2, 1, generator=g) * nuisance
    return x_train, y_train, x_test, y_test, views


@pytest.mark.slow
def test_an_untrained_orthogonal_head_gets_no_resolved_evidence():
    # Rotation-invariant probes (L2 logistic regression, cosine k-NN, alignment, view cosine) read an orthogonal
    # map of the backbone the same in expectation: over 100 seeds at least 95 verdicts must be inconclusive.
    inconclusive = 0
    for seed in range(100):
        x_train, y_train, x_test, y_test, views = _world(seed)
        q, _ = torch.linalg.qr(torch.randn(8, 8, generator=torch.Generator().manual_seed(1000 + seed)))
        b, pb = _probe_all(x_train, y_train, x_test, y_test, views, "backbone")
        h, ph = _probe_all(x_train @ q, y_train, x_test @ q, y_test, views @ q, "relu")
        resamples = {"test images": bootstrap_resamples(120, 500, seed, strata=y_test),
                     "images with views": bootstrap_resamples(160, 500, seed)}
        out = buffer_verdict(tap_measures({"backbone": b, "relu": h}, {"backbone": pb, "relu": ph}), "relu", resamples)
        inconclusive += out.verdict == "inconclusive"
    assert inconclusive >= 95


def test_a_head_that_discards_the_nuisance_direction_is_resolved_for_on_invariance():
    x_train, y_train, x_test, y_test, views = _world(0)
    drop = torch.eye(8)
    drop[-1, -1] = 0.0  # the head projects out the coordinate the views differ in
    b, pb = _probe_all(x_train, y_train, x_test, y_test, views, "backbone")
    h, ph = _probe_all(x_train @ drop, y_train, x_test @ drop, y_test, views @ drop, "relu")
    resamples = {"test images": bootstrap_resamples(120, 2000, 0, strata=y_test),
                 "images with views": bootstrap_resamples(160, 2000, 0)}
    out = buffer_verdict(tap_measures({"backbone": b, "relu": h}, {"backbone": pb, "relu": ph}), "relu", resamples)
    evidence = out.evidence
    assert evidence["view_spread_rel"].resolved == "for" and evidence["view_spread_rel"].ci95[0] > 0
    assert "align" not in evidence and "view_cos" not in evidence  # raw invariance describes, it is not evidence
    # A projection cannot add label information, and the class means reach into the dropped coordinate: the
    # (whitened) linear probe's loss is outside its interval's reach of 0, and nothing is against, so the head is a
    # buffer. The label bound, from that probe's log-likelihood at the C chosen for accuracy (0.1 at the backbone, 1
    # at the head here), does not resolve the loss; with the unstandardised probe it did.
    assert evidence["linear.acc"].ci95[0] > 0 and evidence["mi.label"].resolved != "against"
    assert (out.verdict, out.against) == ("buffer", 0)


def _bunched_world(seed: int, n=160, d=8):
    """Backbone views bunched around a common offset (as the offline backbone's are) that differ along a nuisance
    direction; the head centres them, scales them ×3 and shrinks the nuisance to a fifth."""
    g = torch.Generator().manual_seed(seed)
    content = torch.randn(n, 1, d, generator=g, dtype=torch.float64)
    nuisance = torch.zeros(d, dtype=torch.float64)
    nuisance[-1] = 1.0
    shift = torch.randn(n, 4, 1, generator=g, dtype=torch.float64) * nuisance
    offset = torch.full((d,), 6.0, dtype=torch.float64)
    backbone = offset + content + shift
    head = 3.0 * (content + 0.2 * shift)
    return backbone, head


def test_raw_alignment_rising_does_not_decide_when_relative_alignment_falls():
    backbone, head = _bunched_world(0)
    b, h = view_tap(backbone, "backbone"), view_tap(head, "relu")
    out_b, out_h = invariance(b), invariance(h)
    assert out_h.metrics["align"] > 2 * out_b.metrics["align"]  # raw: the head looks *less* invariant
    assert out_h.metrics["view_spread_rel"] < 0.5 * out_b.metrics["view_spread_rel"]  # relative: far more
    resamples = {"images with views": bootstrap_resamples(160, 2000, 0)}
    out = buffer_verdict(tap_measures({"backbone": {"metrics": out_b.metrics}, "relu": {"metrics": out_h.metrics}},
                                      {"backbone": out_b.per_unit, "relu": out_h.per_unit}), "relu", resamples)
    assert set(out.evidence) == {"view_spread_rel"}
    assert out.evidence["view_spread_rel"].resolved == "for" and out.verdict == "buffer"


def view_tap(views: torch.Tensor, name: str) -> TapData:
    empty, labels = torch.zeros(2, views.shape[-1]), torch.zeros(2, dtype=torch.long)
    return TapData(name, empty, labels, empty, labels, 2, views=views)


def test_every_metric_has_one_predicted_direction_and_descriptions_have_none():
    assert predicted_change("linear.acc") == predicted_change("knn.k10.acc") == predicted_change("knn.k200.acc") == -1
    assert predicted_change("rotation.acc") == predicted_change("mi.label") == predicted_change("aug_r2.mean") == -1
    assert predicted_change("view_spread_rel") == predicted_change("hue.orbit.spread_rel") == -1
    assert predicted_change("mi.infonce/ceiling") == 1
    for description in ("align", "view_cos", "uniform", "lidar", "rankme", "linear.C", "linear.val_acc",
                        "knn.k10.acc.extra", "hue.orbit.curvature", "aug_r2.hue"):
        assert predicted_change(description) is None, description


def test_knn_accuracy_is_class_evidence_like_the_linear_probe():
    # The quickstart's pattern: the linear probe drops at the head, k-NN rises. Both count, so the verdict is mixed.
    resamples = {"test images": bootstrap_resamples(450, n_boot=2000, seed=0)}
    lin, lin_metrics = _paired(450, 0, head_gap=0.05)
    knn_values, knn_metrics = _paired(450, 1, head_gap=0.05)
    samples = {"backbone": lin["backbone"] | {"knn.k10.acc": knn_values["relu"]["linear.acc"]},
               "relu": lin["relu"] | {"knn.k10.acc": knn_values["backbone"]["linear.acc"]}}
    tap_metrics = {tap: {"metrics": lin_metrics[tap]["metrics"] | {"knn.k10.acc": samples[tap]["knn.k10.acc"].value()}}
                   for tap in ("backbone", "relu")}
    out = buffer_verdict(tap_measures(tap_metrics, samples), "relu", resamples)
    knn_entry, linear_entry = out.evidence["knn.k10.acc"], out.evidence["linear.acc"]
    assert knn_entry.resolved == "against" and linear_entry.resolved == "for"
    assert knn_entry.claim == "backbone keeps more" and out.verdict == "mixed"


def _infonce_taps(backbone_nce: float) -> dict:
    seeds = {str(s): {"metrics": {"mi.infonce": 2.0 + 0.01 * s, "mi.infonce.ceiling": 4.0}} for s in range(3)}
    return {"backbone": {"metrics": {"mi.infonce": backbone_nce, "mi.infonce.ceiling": 4.0}},
            "relu": {"metrics": {"mi.infonce": 2.01, "mi.infonce.ceiling": 4.0}, "seeds": seeds}}


def test_a_critic_no_better_than_chance_keeps_infonce_out_of_the_verdict():
    informative = buffer_verdict(tap_measures(_infonce_taps(0.5)), "relu").evidence["mi.infonce/ceiling"]
    assert informative.resolved == "for" and informative.p < 0.05  # three seeds, one clear margin
    for backbone_nce in (-0.087, 0.0):
        out = buffer_verdict(tap_measures(_infonce_taps(backbone_nce)), "relu")
        entry = out.evidence["mi.infonce/ceiling"]
        assert entry.resolved == "unresolved" and entry.p is None and entry.ci95 is None
        assert entry.why_unresolved.startswith("critic uninformative") and out.verdict == "inconclusive"
        assert "0 testable" in out.rule


def rule_as_written_before_the_declarations(metric: str):
    """`stats.verdict.evidence_rule` as it was written before the probes declared their metrics (main, 2026-12)."""
    import re

    if metric in ("linear.acc", "rotation.acc", "rotation.mlp.acc", "aug_r2.mean", "mi.label") or re.fullmatch(
            r"knn\.k\d+\.acc", metric):
        return -1, "backbone keeps more"
    if metric in ("view_spread_rel", "orbit.spread_rel") or metric.endswith(".orbit.spread_rel"):
        return -1, "head more invariant"
    if metric in ("mi.infonce", "mi.infonce/ceiling"):
        return +1, "head more invariant"
    return None


def test_the_declared_evidence_rule_equals_the_written_one_on_every_metric_of_real_runs():
    from headprobe.stats.verdict import evidence_rule

    record = json.loads((Path(__file__).parent / "fixtures" / "run_metric_names.json").read_text())
    names = {name for names in record["names"].values() for name in names}
    assert {"linear.acc", "knn.k20.acc", "rotation.acc", "aug_r2.crop_x", "rotation45.orbit.spread_rel",
            "mi.infonce/ceiling", "linear.C"} <= names  # both runs' probes, the verdict's pieces among them
    names |= {f"{sweep}.orbit.{m}" for sweep in ("hue", "rotation360", "blur") for m in ("spread_rel", "spread")}
    for name in sorted(names):
        assert evidence_rule(name) == rule_as_written_before_the_declarations(name), name
