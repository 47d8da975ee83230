"""The buffer verdict: every sweep's spread is evidence, and only margins beyond the noise are resolved."""

import pytest
import torch

from headprobe.buffer import buffer_verdict
from headprobe.probes.suite import TapData, invariance, knn, linear
from headprobe.stats import PerUnit, bootstrap_resamples

pytestmark = pytest.mark.usefixtures("single_thread")


def taps(backbone: dict, head: dict) -> dict:
    return {"backbone": {"metrics": backbone}, "relu": {"metrics": head}}


def test_any_sweep_spread_is_its_own_piece_of_evidence():
    result = buffer_verdict(taps(
        {"linear.acc": 0.9, "rotation45.orbit.spread_rel": 0.30, "hue.orbit.spread_rel": 0.20,
         "orbit.spread_rel": 0.25, "rotation45.orbit.curvature": 1.0, "blur.orbit.spread_rel": 0.1},
        {"linear.acc": 0.8, "rotation45.orbit.spread_rel": 0.10, "hue.orbit.spread_rel": 0.25,
         "orbit.spread_rel": 0.25, "rotation45.orbit.curvature": 2.0},
    ), "relu")
    evidence = result["evidence"]
    assert set(evidence) == {"linear.acc", "rotation45.orbit.spread_rel", "hue.orbit.spread_rel", "orbit.spread_rel"}
    assert evidence["rotation45.orbit.spread_rel"]["margin"] == pytest.approx(0.20)  # lower at the head: as claimed
    assert evidence["hue.orbit.spread_rel"]["margin"] == pytest.approx(-0.05)
    assert all(e["claim"] == "head more invariant" for k, e in evidence.items() if "orbit" in k)
    # Point estimates alone resolve nothing: without per-unit values there is no interval.
    assert result["verdict"] == "inconclusive" and result["unresolved"] == 4
    assert all(e["resolved"] == "unresolved" and e["ci95"] is None and "why_unresolved" in e
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
    clear = buffer_verdict(tap_metrics, "relu", samples, resamples)
    entry = clear["evidence"]["linear.acc"]
    assert entry["resolved"] == "for" and clear["verdict"] == "buffer"
    assert entry["ci95"][0] > 0 and entry["ci95"][0] < entry["margin"] < entry["ci95"][1]
    samples, tap_metrics = _paired(450, 1, head_gap=0.002)
    assert buffer_verdict(tap_metrics, "relu", samples, resamples)["verdict"] == "inconclusive"


def test_the_head_doing_better_is_resolved_against():
    resamples = {"test images": bootstrap_resamples(450, n_boot=2000, seed=0)}
    samples, tap_metrics = _paired(450, 0, head_gap=0.05)
    samples = {"backbone": samples["relu"], "relu": samples["backbone"]}
    tap_metrics = {"backbone": tap_metrics["relu"], "relu": tap_metrics["backbone"]}
    out = buffer_verdict(tap_metrics, "relu", samples, resamples)
    assert out["verdict"] == "no-buffer" and out["evidence"]["linear.acc"]["resolved"] == "against"


def _probe_all(x_train, y_train, x_test, y_test, views, name):
    tap = TapData(name, x_train, y_train, x_test, y_test, n_classes=int(y_train.max()) + 1, views=views)
    metrics, per_unit = {}, {}
    # Unstandardised L2 logistic regression is rotation-invariant; per-feature standardisation is not.
    for probe, options in ((linear, {"standardize": False, "C_grid": (0.1, 1.0)}), (knn, {}), (invariance, {})):
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
        out = buffer_verdict({"backbone": b, "relu": h}, "relu", {"backbone": pb, "relu": ph}, resamples)
        inconclusive += out["verdict"] == "inconclusive"
    assert inconclusive >= 95


def test_a_head_that_discards_the_nuisance_direction_is_resolved_for_on_invariance():
    x_train, y_train, x_test, y_test, views = _world(0)
    drop = torch.eye(8)
    drop[-1, -1] = 0.0  # the head projects out the coordinate the views differ in
    b, pb = _probe_all(x_train, y_train, x_test, y_test, views, "backbone")
    h, ph = _probe_all(x_train @ drop, y_train, x_test @ drop, y_test, views @ drop, "relu")
    resamples = {"test images": bootstrap_resamples(120, 2000, 0, strata=y_test),
                 "images with views": bootstrap_resamples(160, 2000, 0)}
    out = buffer_verdict({"backbone": b, "relu": h}, "relu", {"backbone": pb, "relu": ph}, resamples)
    assert out["evidence"]["align"]["resolved"] == "for" and out["evidence"]["view_cos"]["resolved"] == "for"
    assert out["evidence"]["align"]["ci95"][0] > 0
    assert out["verdict"] in ("buffer", "mixed")
