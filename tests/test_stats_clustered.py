"""stats.clustered: Wilson against its closed form, the design effect against a hand computation, the cluster
bootstrap's and Newcombe's intervals, and coverage of the proportion interval by simulation."""

import math

import pytest
import torch

from headprobe.stats.clustered import (
    cluster_bootstrap,
    design_effect,
    difference_interval,
    icc,
    proportion_interval,
    wilson,
)


def test_wilson_matches_the_closed_form_at_zero_and_in_the_middle():
    z = 1.959963984540054
    assert wilson(0, 150) == pytest.approx((0.0, z * z / (150 + z * z)), abs=1e-15)
    low, high = wilson(30, 100)
    p, n = 0.3, 100
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert (low, high) == pytest.approx((centre - half, centre + half), abs=1e-15)


def test_intra_seed_correlation_is_one_when_seeds_disagree_wholly_and_zero_within_seeds_alike():
    assert icc([[1.0] * 10, [0.0] * 10]) == 1.0
    assert design_effect([[1.0] * 10, [0.0] * 10]) == 10.0
    assert icc([[1.0, 0.0] * 5, [1.0, 0.0] * 5]) == 0.0
    # by hand: p = 0.5, cluster means 0.75 / 0.25: MSB = 2·4·0.0625 / 1 = 0.5, MSW = 4·0.1875·2 / 6 = 0.25,
    # n0 = 4: ICC = 0.25 / (0.5 + 3·0.25) = 0.2
    assert icc([[1, 1, 1, 0], [0, 0, 0, 1]]) == pytest.approx(0.2, abs=1e-15)


def test_cluster_bootstrap_stays_within_the_seed_means_range_and_is_a_point_when_all_agree():
    low, high = cluster_bootstrap([[0.1, 0.2], [0.5, 0.6], [0.9]])
    assert 0.1 <= low < high <= 0.9
    assert cluster_bootstrap([[0.0] * 5] * 3) == (0.0, 0.0)


def test_proportion_interval_is_the_envelope_and_covers_under_seed_clustering():
    out = proportion_interval([[0.0] * 50] * 3)
    assert out["ci95"] == [0.0, out["wilson"][1]] and out["value"] == 0.0
    # 3 seeds × 50 states, each seed its own probability (beta-distributed around 0.7): coverage of 0.7
    gen = torch.Generator().manual_seed(0)
    covered = 0
    for _ in range(200):
        probs = _beta(gen)
        clusters = [(torch.rand(50, generator=gen) < p).double().tolist() for p in probs]
        low, high = proportion_interval(clusters, n_boot=400)["ci95"]
        covered += low <= 0.7 <= high
    assert covered / 200 >= 0.85


def _beta(gen: torch.Generator) -> torch.Tensor:
    """Three draws of Beta(7, 3) (mean 0.7) from `gen`, by the ratio of gamma-like sums of uniforms' logs."""
    a = -torch.log(torch.rand(3, 7, generator=gen)).sum(dim=1)
    b = -torch.log(torch.rand(3, 3, generator=gen)).sum(dim=1)
    return a / (a + b)


def test_difference_interval_contains_the_difference_and_pairs_seeds():
    out = difference_interval([[1.0] * 50] * 3, [[0.0] * 50] * 3)
    assert out["value"] == 1.0 and out["ci95"][1] == 1.0 and 0.95 < out["ci95"][0] < 1.0
    u = wilson(0, 150)[1]  # 1 − the lower Wilson limit of 150/150, and the upper one of 0/150
    assert out["newcombe"][0] == pytest.approx(1 - math.hypot(u, u), abs=1e-12)
    with pytest.raises(ValueError, match="pairs seeds"):
        difference_interval([[1.0]], [[1.0], [0.0]])
