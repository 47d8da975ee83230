"""The buffer verdict reads every orbit sweep's scale-free spread, whatever the sweep is called."""

import pytest

from headprobe.buffer import buffer_verdict


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
    assert result["verdict"] == "mixed" and result["support"] == 2 and result["against"] == 1


def test_a_rotation45_spread_changes_the_verdict():
    backbone, head = {"linear.acc": 0.80}, {"linear.acc": 0.85}  # the head keeps more: against the claim
    assert buffer_verdict(taps(backbone, head), "relu")["verdict"] == "no-buffer"
    with_orbit = buffer_verdict(taps(backbone | {"rotation45.orbit.spread_rel": 0.4},
                                     head | {"rotation45.orbit.spread_rel": 0.1}), "relu")
    assert "rotation45.orbit.spread_rel" in with_orbit["evidence"]
    assert with_orbit["verdict"] == "mixed"
    spread = "rotation45.orbit.spread_rel"
    only_orbit = buffer_verdict(taps({spread: 0.4}, {spread: 0.1}), "relu")
    assert only_orbit["verdict"] == "buffer"  # was "insufficient": the sweep's spread was never read
