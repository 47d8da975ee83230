"""Bootstrap intervals and the Holm correction against exact answers and coverage simulations."""

import numpy as np
import pytest
import torch

from headprobe.stats import (
    PerUnit,
    Resamples,
    bootstrap_p_value,
    bootstrap_resamples,
    holm,
    interval,
    percentile_interval,
    resampled_means,
    seed_interval,
)

pytestmark = pytest.mark.usefixtures("single_thread")


def test_stratified_resamples_keep_each_class_and_its_size():
    strata = torch.tensor([0] * 5 + [1] * 3 + [2] * 7)
    idx = bootstrap_resamples(15, n_boot=200, seed=1, strata=strata).indices
    assert idx.shape == (200, 15)
    assert torch.equal(strata[idx], strata.expand(200, 15))  # position j always draws from j's class
    assert torch.equal(idx, bootstrap_resamples(15, n_boot=200, seed=1, strata=strata).indices)
    assert not torch.equal(idx, bootstrap_resamples(15, n_boot=200, seed=2, strata=strata).indices)
    # Within a class, draws are uniform over its members.
    counts = torch.bincount(idx[:, :5].flatten(), minlength=15)[:5].double()
    assert (counts / counts.sum() - 0.2).abs().max() < 0.03


def test_holm_matches_the_step_down_definition():
    p = {"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.5}
    adjusted = holm(p)
    # sorted: a 0.01·4 = 0.04, c 0.03·3 = 0.09, b 0.04·2 = 0.08 -> monotone 0.09, d 0.5·1 -> 0.5
    assert adjusted == pytest.approx({"a": 0.04, "c": 0.09, "b": 0.09, "d": 0.5})
    assert holm({}) == {}


def test_p_value_and_interval_of_known_replicates():
    boot = torch.linspace(-1, 9, 1001)  # 101 of 1001 replicates at or below 0
    assert bootstrap_p_value(boot) == pytest.approx(2 * 102 / 1002)
    low, high = percentile_interval(boot)
    assert low == pytest.approx(np.quantile(boot.numpy(), 0.025)) and high == pytest.approx(
        np.quantile(boot.numpy(), 0.975))
    assert bootstrap_p_value(torch.zeros(10)) == 1.0


def test_resampled_means_are_means_of_the_drawn_values():
    values = torch.arange(6, dtype=torch.float64)
    idx = Resamples(torch.tensor([[0, 0, 0, 0, 0, 0], [5, 4, 3, 2, 1, 0], [1, 1, 2, 2, 3, 3]]))
    assert resampled_means(values, idx).tolist() == pytest.approx([0.0, 2.5, 2.0], abs=1e-15)
    assert torch.allclose(idx.weights.sum(1), torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="same units"):
        resampled_means(values[:5], idx)


@pytest.mark.slow
def test_accuracy_interval_covers_the_true_accuracy_95_percent_of_the_time():
    # 400 replications of a 450-image, 10-class stratified test set whose probe is right with probability 0.9:
    # the paired stratified percentile interval must cover 0.9 in 95% ± 3% of them.
    g = torch.Generator().manual_seed(0)
    strata = torch.arange(450) % 10
    hits = 0
    for rep in range(400):
        correct = (torch.rand(450, generator=g) < 0.9).double()
        resamples = bootstrap_resamples(450, n_boot=1000, seed=rep, strata=strata)
        low, high = interval(PerUnit(correct, "test images"), resamples, "bootstrap")["ci95"]
        hits += low <= 0.9 <= high
    assert 0.92 <= hits / 400 <= 0.98


def test_seed_interval_is_the_student_t_interval():
    from scipy import stats

    values = [0.91, 0.93, 0.92]
    out = seed_interval(values)
    low, high = stats.t.interval(0.95, 2, loc=np.mean(values), scale=stats.sem(values))
    assert out["ci95"] == pytest.approx([low, high]) and out["n_seeds"] == 3
    assert out["sd_seeds"] == pytest.approx(np.std(values, ddof=1))
    assert seed_interval([0.5])["ci95"] is None


def test_the_orbit_spread_ratio_is_the_probes_and_is_recomputed_per_resample(tmp_path):
    from headprobe.probes.orbits import orbit_measures
    from headprobe.stats import SpreadRatio, load_per_unit, save_per_unit

    g = torch.Generator().manual_seed(0)
    traj = torch.randn(12, 1, 5, generator=g, dtype=torch.float64) * 3 + torch.randn(12, 7, 5, generator=g,
                                                                                     dtype=torch.float64)
    centres = traj.mean(1)
    stat = SpreadRatio((traj - centres[:, None]).square().sum(-1).mean(1), centres, "orbit images")
    assert stat.value() == pytest.approx(orbit_measures(traj)["orbit.spread_rel"], rel=1e-12)
    resamples = bootstrap_resamples(12, n_boot=50, seed=3)
    boot = stat.replicates(resamples)
    # Each replicate is the probe's own spread_rel on the resampled orbits, up to the n/(n−1) factor, which counts
    # duplicated images as distinct (so compare on one resample without duplicates: a permutation).
    perm = Resamples(torch.randperm(12, generator=g)[None])
    assert stat.replicates(perm)[0] == pytest.approx(stat.value(), rel=1e-12)
    assert boot.shape == (50,) and boot.std() > 0
    stored = {"s.orbit.spread_rel": stat, "acc": PerUnit(torch.ones(3), "test images")}
    save_per_unit(tmp_path / "p.safetensors", stored)
    back = load_per_unit(tmp_path / "p.safetensors")
    assert isinstance(back["s.orbit.spread_rel"], SpreadRatio) and back["s.orbit.spread_rel"].value() == stat.value()
    assert back["acc"].unit == "test images"


def test_a_head_that_shrinks_orbits_is_resolved_for_on_the_spread_ratio():
    from headprobe.buffer import buffer_verdict
    from headprobe.stats import SpreadRatio

    g = torch.Generator().manual_seed(1)
    images = 3 * torch.randn(40, 1, 6, generator=g, dtype=torch.float64)
    noise = torch.randn(40, 8, 6, generator=g, dtype=torch.float64)

    def stat(traj):
        c = traj.mean(1)
        return SpreadRatio((traj - c[:, None]).square().sum(-1).mean(1), c, "orbit images")

    backbone, head = stat(images + noise), stat(images + 0.3 * noise)
    taps = {"backbone": {"metrics": {"s.orbit.spread_rel": backbone.value()}},
            "h": {"metrics": {"s.orbit.spread_rel": head.value()}}}
    out = buffer_verdict(taps, "h", {"backbone": {"s.orbit.spread_rel": backbone}, "h": {"s.orbit.spread_rel": head}},
                         {"orbit images": bootstrap_resamples(40, seed=0)})
    entry = out["evidence"]["s.orbit.spread_rel"]
    assert entry["resolved"] == "for" and entry["ci95"][0] > 0 and out["verdict"] == "buffer"
