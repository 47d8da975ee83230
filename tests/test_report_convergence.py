"""Did a head train? The loss-curve rule of headprobe/report/convergence.py on curves whose answer is known, and
its tail slope against numpy's least-squares fit."""

import math

import numpy as np
import pytest

from headprobe.report.convergence import RULE, tail_fit, training_convergence


def _records(loss, head="h"):
    return [{"stage": "train", "head": head, "step": i + 1, "loss": float(v)} for i, v in enumerate(loss)]


def testtail_fit_is_numpys_least_squares_line():
    rng = np.random.default_rng(0)
    steps = np.arange(10, 40, dtype=float)
    loss = 5.0 - 0.03 * steps + rng.normal(0, 0.05, steps.size)
    (slope, _), cov = np.polyfit(steps, loss, 1, cov="unscaled")
    residuals = loss - np.polyval([slope, _], steps)
    se = math.sqrt(residuals @ residuals / (steps.size - 2) * cov[0, 0])
    drop, drop_se = tail_fit(steps, loss)
    span = steps[-1] - steps[0]
    assert drop == pytest.approx(-slope * span, rel=1e-10) and drop_se == pytest.approx(se * span, rel=1e-10)


def test_a_decayed_loss_is_converged():
    t = np.arange(200)
    verdict = training_convergence(_records(10 * np.exp(-t / 10) + 1 + np.random.default_rng(1).normal(0, 0.01, 200)))
    assert verdict["status"] == "converged" and verdict["converged"] is True
    assert verdict["relative_decrease"] == pytest.approx((verdict["start"] - verdict["end"]) / verdict["start"])
    assert verdict["start"] == pytest.approx(np.mean(10 * np.exp(-t[:20] / 10) + 1), abs=0.01)
    assert verdict["rule"] == RULE


def test_a_loss_still_falling_steadily_is_not_converged():
    verdict = training_convergence(_records(np.linspace(10, 2, 100)))
    assert verdict["status"] == "still falling" and verdict["converged"] is False
    assert verdict["tail_drop"] == pytest.approx(8 / 99 * 24, rel=1e-9)  # slope × the tail's span (25 points)


def test_a_loss_that_barely_moved_is_flagged():
    # VICReg in the issue: 39 → 34.5, flat at the end because the cosine schedule ends near 0
    t = np.linspace(0, 1, 150)
    loss = 34.5 + 4.5 * (1 - np.sin(np.pi / 2 * np.minimum(t * 1.6, 1)))
    verdict = training_convergence(_records(loss + np.random.default_rng(2).normal(0, 0.05, 150)))
    assert verdict["status"] == "barely trained" and verdict["converged"] is False
    assert 0.05 < verdict["relative_decrease"] < 0.2


def test_too_few_points_or_non_finite_losses_are_unknown():
    assert training_convergence(_records([3.0, 2.0, 1.0]))["status"] == "unknown"
    records = _records([5.0, 4.0, float("nan"), 3.0, float("inf"), 2.0, 1.0])
    assert training_convergence(records)["n_points"] == 5
    assert training_convergence([])["converged"] is None
    geometry = [{"stage": "geometry", "head": "h", "step": s, "loss": 1.0} for s in range(10)]
    assert training_convergence(geometry)["n_points"] == 0
