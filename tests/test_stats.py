"""Bootstrap intervals and the Holm correction against exact answers and coverage simulations."""

import numpy as np
import pytest
import torch

from headprobe.stats.bootstrap import (
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
from headprobe.stats.measures import tap_measures

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
    from headprobe.stats.bootstrap import SpreadRatio, load_per_unit, save_per_unit

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
    from headprobe.stats.bootstrap import SpreadRatio
    from headprobe.stats.verdict import buffer_verdict

    g = torch.Generator().manual_seed(1)
    images = 3 * torch.randn(40, 1, 6, generator=g, dtype=torch.float64)
    noise = torch.randn(40, 8, 6, generator=g, dtype=torch.float64)

    def stat(traj):
        c = traj.mean(1)
        return SpreadRatio((traj - c[:, None]).square().sum(-1).mean(1), c, "orbit images")

    backbone, head = stat(images + noise), stat(images + 0.3 * noise)
    taps = {"backbone": {"metrics": {"s.orbit.spread_rel": backbone.value()}},
            "h": {"metrics": {"s.orbit.spread_rel": head.value()}}}
    per_unit = {"backbone": {"s.orbit.spread_rel": backbone}, "h": {"s.orbit.spread_rel": head}}
    resamples = {"orbit images": bootstrap_resamples(40, seed=0)}
    out = buffer_verdict(tap_measures(taps, per_unit), "h", resamples).to_record()
    entry = out["evidence"]["s.orbit.spread_rel"]
    assert entry["resolved"] == "for" and entry["ci95"][0] > 0 and out["verdict"] == "buffer"


# --- statistics that are not means (#14): RankMe, the Gaussian view MI, the orbit measures ----------------------


def test_recomputed_statistics_equal_a_direct_computation_on_a_resample_with_duplicates():
    from headprobe.stats.recomputed import Recomputed, ratio

    g = torch.Generator().manual_seed(0)
    n = 9
    a = torch.rand(n, n, generator=g, dtype=torch.float64)
    a = a + a.T
    idx = torch.tensor([0, 0, 0, 3, 4, 4, 5, 7, 8])  # unit 0 three times, unit 4 twice; 1, 2, 6 missing
    pairs = Recomputed("pair_mean", {"pairs": a}, "u")
    # Every pair of draws of two *different* units, as often as they were drawn together.
    draws = [(i, j) for p, i in enumerate(idx.tolist()) for q, j in enumerate(idx.tolist()) if p != q and i != j]
    direct = sum(float(a[i, j]) for i, j in draws) / len(draws)
    assert float(pairs.replicates(Resamples(idx[None]))[0]) == pytest.approx(direct, rel=1e-12)
    assert pairs.value() == pytest.approx(float(a.sum() - a.diagonal().sum()) / (n * (n - 1)), rel=1e-12)

    centroids = torch.randn(n, 4, generator=g, dtype=torch.float64) + 50.0  # a large common mean loses no digits
    classes = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    inter = Recomputed("class_distance", {"centroids": centroids, "classes": classes}, "u")
    drawn, drawn_classes = centroids[idx], classes[idx]
    nu = torch.stack([drawn[drawn_classes == c].mean(0) for c in range(3)])
    assert float(inter.replicates(Resamples(idx[None]))[0]) == pytest.approx(float(torch.pdist(nu).mean()), rel=1e-9)
    values = Recomputed("mean", {"values": a[0]}, "u")
    assert ratio(inter, values).value() == pytest.approx(inter.value() / values.value(), rel=1e-12)
    with pytest.raises(ValueError, match="different numbers of units"):
        Recomputed("mean", {"values": a[0], "other": a[0, :3]}, "u")
    with pytest.raises(ValueError, match="kind 'median' is unknown"):
        Recomputed("median", {"values": a[0]}, "u")


@pytest.mark.parametrize("sweep", ["rotation45", "rotation360"])
def test_orbit_statistics_are_the_probes_orbit_measures(sweep):
    from headprobe.probes.orbit_intervals import orbit_statistics
    from headprobe.probes.orbits import orbit_measures

    g = torch.Generator().manual_seed(2)
    traj = 3 * torch.randn(16, 1, 6, generator=g, dtype=torch.float64) + torch.randn(16, 8, 6, generator=g,
                                                                                     dtype=torch.float64) + 5
    labels = torch.arange(16) % 4
    measures = {k: v for k, v in orbit_measures(traj, sweep=sweep, labels=labels).items() if k.startswith("orbit.")}
    stats = orbit_statistics(traj, sweep=sweep, labels=labels)
    assert set(stats) == set(measures)
    for name, value in measures.items():
        assert stats[name].value() == pytest.approx(value, rel=1e-12, abs=1e-14), name
    assert "orbit.d_inter" not in orbit_statistics(traj, sweep=sweep)
    boot = stats["orbit.d_ratio"].replicates(bootstrap_resamples(16, n_boot=100, seed=0, strata=labels))
    assert boot.shape == (100,) and boot.std() > 0


def test_recomputed_statistics_survive_save_and_load(tmp_path):
    from headprobe.probes.orbit_intervals import orbit_statistics
    from headprobe.stats.bootstrap import load_per_unit, save_per_unit
    from headprobe.stats.recomputed import Recomputed

    g = torch.Generator().manual_seed(3)
    traj = torch.randn(10, 5, 4, generator=g, dtype=torch.float64)
    stats = {f"s.{k}": v for k, v in orbit_statistics(traj, labels=torch.arange(10) % 2).items()}
    save_per_unit(tmp_path / "p.safetensors", stats)
    back = load_per_unit(tmp_path / "p.safetensors")
    resamples = bootstrap_resamples(10, n_boot=20, seed=1, strata=torch.arange(10) % 2)
    assert set(back) == set(stats)
    for name, stat in stats.items():
        assert type(back[name]) is type(stat) and back[name].unit == stat.unit
        assert torch.equal(back[name].replicates(resamples), stat.replicates(resamples)), name
        if isinstance(stat, Recomputed):
            assert (back[name].kind, back[name].how, back[name].reflect) == (stat.kind, stat.how, stat.reflect)
    assert back["s.orbit.d_ratio"].reflect and not back["s.orbit.d_intra_rel"].reflect


def _gaussian_rows(g, n: int, scales: torch.Tensor) -> torch.Tensor:
    return torch.randn(n, len(scales), generator=g, dtype=torch.float64) * scales + 0.5


def test_rankme_linearised_replicates_track_the_exact_ones_which_are_biased_low():
    from headprobe.probes.influence import rankme_per_row
    from headprobe.probes.spectrum import rankme

    g = torch.Generator().manual_seed(4)
    z = _gaussian_rows(g, 600, torch.linspace(0.2, 2, 32))
    values = rankme_per_row(z)
    assert float(values.mean()) == pytest.approx(rankme(z), rel=1e-12)
    resamples = bootstrap_resamples(600, n_boot=150, seed=0)
    linearised = resamples.weights @ values
    exact = torch.tensor([rankme(z[i]) for i in resamples.indices], dtype=torch.float64)
    assert torch.corrcoef(torch.stack([exact, linearised]))[0, 1] > 0.9  # the same resamples, the same ups and downs
    assert 0.8 < float(linearised.std() / exact.std()) < 1.25
    # Duplicated rows narrow a resample's spectrum: the recomputed replicates sit below the estimate (the reason the
    # interval is linearised), the linearised ones around it.
    assert float(exact.mean()) - rankme(z) < -2 * float(exact.std())
    assert abs(float(linearised.mean()) - rankme(z)) < 0.3 * float(linearised.std())


def test_rankme_interval_covers_its_expectation_95_percent_of_the_time():
    from headprobe.probes.influence import rankme_per_row
    from headprobe.probes.spectrum import rankme

    # 200 replications of 300 rows in 5 dimensions; the truth is RankMe's expectation at 300 rows (RankMe depends
    # on N), from 2,000 fresh samples.
    g = torch.Generator().manual_seed(5)
    scales = torch.tensor([0.3, 0.6, 1.0, 1.5, 2.0], dtype=torch.float64)
    fresh = torch.tensor([rankme(_gaussian_rows(g, 300, scales)) for _ in range(2000)])
    truth = float(fresh.mean())
    hits, spreads = 0, []
    for rep in range(200):
        values = PerUnit(rankme_per_row(_gaussian_rows(g, 300, scales)), "training images")
        record = interval(values, bootstrap_resamples(300, n_boot=1000, seed=rep), "bootstrap")
        low, high = record["ci95"]
        hits += low <= truth <= high
        spreads.append(record["se"])
    # Measured: 91% here (92-94% on other seeds and at 1,000 rows), the bootstrap's spread within 2% of the
    # sampling spread of 2,000 fresh samples.
    assert 0.90 <= hits / 200 <= 0.99
    assert sum(spreads) / len(spreads) == pytest.approx(float(fresh.std()), rel=0.1)


def test_gaussian_mi_interval_covers_the_true_mi_95_percent_of_the_time():
    import math

    from headprobe.probes.influence import gaussian_mi_per_pair
    from headprobe.probes.information import gaussian_mi

    # Two views with canonical correlations 0.8 and 0.4: I = −½ Σ log(1 − ρ²), and gaussian_mi is unbiased for it.
    rho = torch.tensor([0.8, 0.4], dtype=torch.float64)
    truth = float(-0.5 * torch.log1p(-rho.square()).sum())
    g = torch.Generator().manual_seed(6)
    hits = 0
    for rep in range(200):
        x = torch.randn(300, 2, generator=g, dtype=torch.float64)
        y = rho * x + (1 - rho.square()).sqrt() * torch.randn(300, 2, generator=g, dtype=torch.float64)
        mi = gaussian_mi(x, y, shrinkage=None)["mi"]
        values = PerUnit(gaussian_mi_per_pair(x, y, mi), "images with views")
        assert math.isclose(values.value(), mi, rel_tol=1e-12)
        low, high = interval(values, bootstrap_resamples(300, n_boot=500, seed=rep), "bootstrap")["ci95"]
        hits += low <= truth <= high
    assert 0.90 <= hits / 200 <= 0.99


def test_class_centroid_distance_needs_the_basic_interval():
    from headprobe.stats.recomputed import Recomputed

    # 5 classes of 6 orbit images: resampled centroids are noisier, which lengthens their distances just as the
    # estimate's own noise does, so the percentile interval lies above the truth and the basic one covers it.
    g = torch.Generator().manual_seed(0)
    means = 0.7 * torch.randn(5, 8, generator=g, dtype=torch.float64)
    truth = float(torch.pdist(means).mean())
    labels = torch.arange(5).repeat_interleave(6)
    covered = {"percentile": 0, "basic": 0}
    for rep in range(200):
        centroids = means[labels] + torch.randn(30, 8, generator=g, dtype=torch.float64)
        resamples = bootstrap_resamples(30, n_boot=500, seed=rep, strata=labels)
        for name, reflect in (("percentile", False), ("basic", True)):
            stat = Recomputed("class_distance", {"centroids": centroids, "classes": labels}, "orbit images",
                              reflect=reflect)
            low, high = interval(stat, resamples, "bootstrap")["ci95"]
            covered[name] += low <= truth <= high
    assert covered["basic"] / 200 >= 0.88 and covered["percentile"] / 200 <= 0.5


def test_taps_share_the_training_image_resamples_so_rankme_margins_are_paired():
    from types import SimpleNamespace

    from headprobe.pipeline.taps import tap_intervals
    from headprobe.probes.builtin.spectrum import SPECTRUM as spectrum
    from headprobe.probes.tap_data import TapData
    from headprobe.record.directory import RunDir
    from headprobe.record.writer import RecordWriter
    from headprobe.stats.bootstrap import TRAIN_IMAGES

    g = torch.Generator().manual_seed(7)
    x = _gaussian_rows(g, 400, torch.linspace(0.3, 2, 12))
    y = torch.arange(400) % 4
    head = x @ torch.linalg.qr(torch.randn(12, 12, generator=g, dtype=torch.float64))[0]  # the same spectrum
    head[:, 0] *= 1.05
    outs = {name: spectrum(TapData(name, z, y, z[:10], y[:10], 4)) for name, z in (("backbone", x), ("h", head))}
    results = {"taps": {name: {"metrics": dict(o.metrics)} for name, o in outs.items()}}
    writer = RecordWriter(RunDir("unused", writable=False), results | {"timing": {}}, None)
    writer.per_unit = {name: dict(o.per_unit) for name, o in outs.items()}
    ctx = SimpleNamespace(resamples={}, recipe=SimpleNamespace(seed=0), record=writer,
                          verify_cache=lambda final=False: None)
    features = SimpleNamespace(train=SimpleNamespace(labels=y), test=SimpleNamespace(labels=y[:10]))
    for name, measured in writer.measures().items():
        writer.summary(tap_intervals(ctx, features, name, measured))
    resamples = ctx.resamples[TRAIN_IMAGES]
    assert resamples.stratified and list(ctx.resamples) == [TRAIN_IMAGES]  # one set, drawn once, for both taps
    record = results["taps"]["backbone"]["uncertainty"]["rankme"]
    assert record["unit"] == TRAIN_IMAGES and record["n_units"] == 400 and "linearised" in record["method"]
    low, high = record["ci95"]
    assert low < results["taps"]["backbone"]["metrics"]["rankme"] < high
    b, h = writer.per_unit["backbone"]["rankme"], writer.per_unit["h"]["rankme"]
    paired = b.replicates(resamples) - h.replicates(resamples)
    unpaired = b.replicates(resamples) - h.replicates(bootstrap_resamples(400, seed=99, strata=y))
    assert float(paired.std()) < 0.5 * float(unpaired.std())


def test_seed_mean_of_recomputed_statistics_averages_each_seed_s_replicates_on_the_same_resamples():
    from headprobe.stats.bootstrap import SeedMean, SpreadRatio, bootstrap_resamples, tap_uncertainty

    g = torch.Generator().manual_seed(3)
    parts = [SpreadRatio(torch.rand(40, generator=g, dtype=torch.float64),
                         torch.randn(40, 5, generator=g, dtype=torch.float64), "orbit images") for _ in range(3)]
    combined = SeedMean(parts, "orbit images")
    resamples = bootstrap_resamples(40, n_boot=300, seed=1)
    expected = torch.stack([p.replicates(resamples) for p in parts]).mean(0)
    assert torch.allclose(combined.replicates(resamples), expected, rtol=0, atol=1e-15)
    assert combined.value() == pytest.approx(sum(p.value() for p in parts) / 3, rel=1e-15)
    assert resamples.replicates_of(parts[0]) is resamples.replicates_of(parts[0])  # computed once, shared
    record = tap_uncertainty({"orbit.spread_rel": combined.value()}, {"orbit.spread_rel": combined},
                             {"orbit images": resamples})["orbit.spread_rel"]
    assert "mean over 3 seeds" in record["method"] and record["ci95"][0] <= combined.value() <= record["ci95"][1]
