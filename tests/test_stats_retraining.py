"""The interval of a head's change that includes retraining (headprobe/stats/retraining.py): exact small cases, and
its coverage by simulation with a known effect, seed variance and image noise."""

import math

import pytest
import torch
from scipy import stats as scipy_stats

from headprobe.stats.bootstrap import PerUnit, bootstrap_resamples
from headprobe.stats.retraining import (
    HIERARCHICAL,
    IMAGES_ONLY,
    NONE,
    T_SEEDS,
    change_interval,
    hierarchical_replicates,
)

UNIT = "test images"


def _unit(values) -> PerUnit:
    return PerUnit(torch.as_tensor(values, dtype=torch.float64), UNIT)


def test_one_seed_is_the_paired_image_bootstrap_and_says_it_covers_images_only():
    g = torch.Generator().manual_seed(0)
    b, h = torch.rand(50, generator=g, dtype=torch.float64), torch.rand(50, generator=g, dtype=torch.float64)
    resamples = bootstrap_resamples(50, 400, seed=3)
    out = change_interval(float(b.mean()), [float(h.mean())], _unit(b), [_unit(h)], {UNIT: resamples})
    expected = resamples.weights @ (h - b)  # the resampled means of the per-image differences
    assert torch.allclose(out.boot, expected, atol=1e-12)
    assert out.kind == IMAGES_ONLY and "not retraining" in out.how
    assert out.change == pytest.approx(float((h - b).mean()), abs=1e-12)
    assert out.ci95 == pytest.approx(torch.quantile(expected, torch.tensor([0.025, 0.975],
                                                                           dtype=torch.float64)).tolist())
    assert (out.n_seeds, out.n_units, out.unit) == (1, 50, UNIT)


def test_hierarchical_replicates_draw_seeds_per_resample_on_the_same_images():
    backbone = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64)
    heads = torch.tensor([[10.0, 11.0, 12.0, 13.0], [20.0, 21.0, 22.0, 23.0], [30.0, 31.0, 32.0, 33.0]],
                         dtype=torch.float64)
    boot = hierarchical_replicates(backbone, heads, seed=5)
    drawn = torch.randint(3, (4, 3), generator=torch.Generator().manual_seed(5))
    # Resample b: the drawn seeds' head statistics on resample b, averaged, minus the backbone on resample b.
    expected = torch.tensor([sum(heads[s, b] for s in drawn[b]) / 3 - backbone[b] for b in range(4)])
    assert torch.allclose(boot, expected.double())
    assert torch.equal(hierarchical_replicates(backbone, heads[:1]), heads[0] - backbone)


def test_the_t_interval_over_seeds_matches_scipy_and_its_p_value_is_the_t_test():
    changes = [-0.10, -0.04, -0.07]
    out = change_interval(0.8, [0.8 + c for c in changes])  # no per-image values: seeds only
    test = scipy_stats.ttest_1samp(changes, 0.0)
    assert out.kind == T_SEEDS
    assert out.ci95 == pytest.approx(list(test.confidence_interval(0.95)), abs=1e-12)
    assert out.p_value(0.0) == pytest.approx(test.pvalue, rel=1e-9)
    assert out.p_value(-0.02) == pytest.approx(scipy_stats.ttest_1samp(changes, -0.02).pvalue, rel=1e-9)


def test_no_interval_without_per_image_values_or_spread():
    assert change_interval(0.5, [0.4]).kind == NONE
    identical = change_interval(0.5, [0.4, 0.4])
    assert identical.kind == NONE and identical.ci95 is None and identical.p_value() is None
    assert "agree exactly" in identical.how


def test_the_wider_interval_is_taken_and_named():
    g = torch.Generator().manual_seed(1)
    b = torch.rand(200, generator=g, dtype=torch.float64)
    # Seeds far apart, images nearly identical: the t interval over seeds is the wider.
    heads = [b + shift for shift in (-0.3, 0.0, 0.25)]
    out = change_interval(float(b.mean()), [float(h.mean()) for h in heads], _unit(b), [_unit(h) for h in heads],
                          {UNIT: bootstrap_resamples(200, 500)})
    assert out.kind == T_SEEDS and "wider than the hierarchical bootstrap" in out.how
    # Seeds alike, images differing a lot: the hierarchical bootstrap is the wider.
    noisy = [b + 0.5 * torch.randn(200, generator=g, dtype=torch.float64) for _ in range(3)]
    common = noisy[0] - b
    heads = [b + common + 1e-3 * k for k in range(3)]
    out = change_interval(float(b.mean()), [float(h.mean()) for h in heads], _unit(b), [_unit(h) for h in heads],
                          {UNIT: bootstrap_resamples(200, 500)})
    assert out.kind == HIERARCHICAL and out.ci95[0] < out.change < out.ci95[1]


def _simulate(rep: int, effect: float, sd_seed: float, sd_image_effect: float, sd_noise: float, n: int = 200,
              seeds: int = 3, n_boot: int = 1000):
    """Per-image values of a backbone and of `seeds` retrained heads: b_i = a_i + ε_i, h_si = a_i + effect + c_i +
    u_s + e_si, with c_i an image's own change (the same in every retraining), u_s a retraining's shift; the
    change of "this kind of head" is `effect`."""
    g = torch.Generator().manual_seed(rep)

    def normal(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    a = normal(n)
    b = a + sd_noise * normal(n)
    c = sd_image_effect * normal(n)
    h = [a + effect + c + sd_seed * normal(1) + sd_noise * normal(n) for _ in range(seeds)]
    resamples = {UNIT: bootstrap_resamples(n, n_boot, seed=rep)}
    several = change_interval(float(b.mean()), [float(x.mean()) for x in h], _unit(b), [_unit(x) for x in h],
                              resamples, seed=rep)
    mean_head = torch.stack(h).mean(0)  # what an interval over test images alone sees: the seed-mean per image
    images_only = change_interval(float(b.mean()), [float(mean_head.mean())], _unit(b), [_unit(mean_head)],
                                  resamples)
    seeds_only = change_interval(float(b.mean()), [float(x.mean()) for x in h])
    return several, images_only, seeds_only


def _covers(out, effect: float) -> bool:
    return out.ci95 is not None and out.ci95[0] <= effect <= out.ci95[1]


@pytest.mark.slow
@pytest.mark.parametrize("regime, sd_seed, sd_image_effect", [("retraining dominates", 0.05, 0.1),
                                                              ("images dominate", 0.0, 0.4)])
def test_coverage_of_the_seed_and_image_interval_by_simulation(regime, sd_seed, sd_image_effect):
    effect, reps = -0.05, 400
    covered = {"several": 0, "images only": 0, "seeds only": 0}
    for rep in range(reps):
        several, images_only, seeds_only = _simulate(rep, effect, sd_seed, sd_image_effect, sd_noise=0.1)
        covered["several"] += _covers(several, effect)
        covered["images only"] += _covers(images_only, effect)
        covered["seeds only"] += _covers(seeds_only, effect)
    rate = {k: v / reps for k, v in covered.items()}
    # The interval that includes retraining covers ~95% in both regimes (binomial sd at 400 reps: 1.1 points).
    assert 0.91 <= rate["several"] <= 0.995, rate
    if regime == "retraining dominates":
        # Images alone miss the seed-to-seed variation: their interval covers about half the time here.
        assert rate["images only"] < 0.75, rate
        assert math.isclose(rate["seeds only"], 0.95, abs_tol=0.04), rate
    else:
        # Seeds alone miss the images' own changes, which every retraining repeats.
        assert rate["seeds only"] < 0.6, rate
        assert math.isclose(rate["images only"], 0.95, abs_tol=0.04), rate
