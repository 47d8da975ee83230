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
