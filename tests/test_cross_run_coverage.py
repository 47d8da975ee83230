"""Coverage of the crossed (seeds × images) interval by simulation, where every seed is scored on the same test
images and an image's effect repeats in every seed (headprobe/stats/retraining.py: `hierarchical_replicates`,
`wider_interval`, what `change_interval` and the cross-run answers use).

Per replication, 3 seeds × 200 test images: the no-head run of seed s scores image i as b_si = a_i + e_si and the
run with a head as h_si = a_i + c_i + u_s + e'_si, with c_i the image's own change (the same in every seed), u_s
the seed's and e noise (sd 0.1); the true difference is 0. The variance of the seed mean, (0.02)², is split
between images (c) and seeds (u) in three regimes. Every replication is computed at once (one resample of the
images for all of them, as a run shares one across its taps)."""

import math

import pytest
import torch

from headprobe.stats.bootstrap import PerUnit, bootstrap_resamples
from headprobe.stats.retraining import change_interval, hierarchical_replicates, wider_interval

N_IMAGES, N_SEEDS, REPS, N_BOOT = 200, 3, 2000, 1000
VARIANCE, NOISE = 0.02 ** 2, 0.1
REGIMES = {"image effects dominate": 0.9, "half": 0.5, "seeds dominate": 0.1}  # the images' share of VARIANCE


def _simulate(image_share: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(head, no_head): (REPS, seeds, images) per-image values of the runs of each seed."""
    g = torch.Generator().manual_seed(seed)

    def normal(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    sd_image = math.sqrt(image_share * VARIANCE * N_IMAGES)
    sd_seed = math.sqrt((1 - image_share) * VARIANCE * N_SEEDS)
    a = normal(REPS, 1, N_IMAGES)
    head = a + sd_image * normal(REPS, 1, N_IMAGES) + sd_seed * normal(REPS, N_SEEDS, 1)
    return head + NOISE * normal(REPS, N_SEEDS, N_IMAGES), a + NOISE * normal(REPS, N_SEEDS, N_IMAGES)


def _covers(ci: torch.Tensor) -> float:
    return float(((ci[..., 0] <= 0) & (ci[..., 1] >= 0)).double().mean())


@pytest.mark.parametrize("regime", list(REGIMES))
def test_the_crossed_interval_covers_a_zero_difference_in_every_regime(regime):
    head, no_head = _simulate(REGIMES[regime], seed=len(regime))
    weights = bootstrap_resamples(N_IMAGES, N_BOOT, seed=7).weights  # one image draw, read by every seed
    per_seed = head.mean(-1) - no_head.mean(-1)
    boot = hierarchical_replicates(no_head @ weights.T, head @ weights.T, seed=1)
    ci, _ = wider_interval(per_seed, boot)
    # The interval `change_interval` gives (what the answers read) is this one: the first replications by hand.
    resamples = {"test images": bootstrap_resamples(N_IMAGES, N_BOOT, seed=7)}
    for rep in range(3):
        runs = [[PerUnit(x, "test images") for x in arm[rep]] for arm in (head, no_head)]
        one = change_interval([x.value() for x in runs[1]], [x.value() for x in runs[0]], runs[1], runs[0],
                              resamples, seed=1)
        assert one.ci95 == pytest.approx(ci[rep].tolist(), abs=1e-12)
    coverage = _covers(ci)
    # ≥ 95% in each regime when measured (binomial sd at 2,000 replications: 0.5 points).
    assert coverage >= 0.93, (regime, coverage)
    if regime == "image effects dominate":
        # An independent image resample per seed averages the images' own changes away over the seeds: too narrow.
        independent = torch.stack([(head[:, s] - no_head[:, s]) @ bootstrap_resamples(N_IMAGES, N_BOOT,
                                                                                      seed=100 + s).weights.T
                                   for s in range(N_SEEDS)], 1)
        zero = torch.zeros_like(independent)
        low = _covers(wider_interval(per_seed, hierarchical_replicates(zero, independent, seed=1))[0])
        assert low < 0.93, low
