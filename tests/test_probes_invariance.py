"""The invariance probe's scale-free evidence (`view_spread_rel`) against brute-force pair distances, and the
single-seed intervals of uniformity (recomputed per resample) and LiDAR (linearised) against known values."""

import math

import pytest
import torch

from headprobe.probes.builtin.invariance import INVARIANCE as invariance
from headprobe.probes.lidar_influence import lidar_pseudo_values
from headprobe.probes.spectrum import lidar
from headprobe.probes.tap_data import TapData
from headprobe.probes.view_geometry import sphere_points, uniformity, view_spread
from headprobe.stats.bootstrap import (
    VIEW_IMAGES,
    Linearised,
    SpreadRatio,
    Uniformity,
    bootstrap_resamples,
    load_per_unit,
    percentile_interval,
    save_per_unit,
    tap_uncertainty,
)

pytestmark = pytest.mark.usefixtures("single_thread")


def make_views(n=30, k=4, d=5, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 1, d, generator=g, dtype=torch.float64)
            + 0.4 * torch.randn(n, k, d, generator=g, dtype=torch.float64))


def view_tap(views: torch.Tensor) -> TapData:
    empty, labels = torch.zeros(2, views.shape[-1]), torch.zeros(2, dtype=torch.long)
    return TapData("backbone", empty, labels, empty, labels, 2, views=views)


def test_view_spread_rel_is_positive_pair_over_random_pair_distance():
    views = make_views()
    n, k, _ = views.shape
    value = SpreadRatio(*view_spread(views), VIEW_IMAGES).value()
    flat = views.reshape(n * k, -1)
    squared = torch.cdist(flat, flat).square()
    image = torch.arange(n).repeat_interleave(k)
    same, diagonal = image[:, None] == image[None], torch.eye(n * k, dtype=torch.bool)
    positive, random = squared[same & ~diagonal].mean(), squared[~same].mean()
    assert 2 * k / (k - 1) * value == pytest.approx(float(positive / random), rel=1e-12)


def test_view_spread_rel_is_scale_and_translation_free_and_raw_alignment_is_not():
    views = make_views()
    plain = invariance(view_tap(views)).metrics
    moved = invariance(view_tap(3.0 * views + 7.0)).metrics  # scaled and bunched around a common offset
    assert moved["view_spread_rel"] == pytest.approx(plain["view_spread_rel"], rel=1e-12)
    assert moved["align"] < 0.5 * plain["align"]  # the offset bunches the cloud on the sphere: views look aligned


def test_uniformity_statistic_matches_the_probe_and_brute_force_resamples():
    z = make_views(n=40, k=1)[:, 0]
    stat = Uniformity(sphere_points(z), 2.0, VIEW_IMAGES, block=7)  # blocks that do not divide n
    assert stat.value() == pytest.approx(uniformity(z), abs=1e-12)
    resamples = bootstrap_resamples(40, n_boot=5, seed=1)
    points = sphere_points(z)
    for replicate, drawn in zip(stat.replicates(resamples), resamples.indices, strict=True):
        kernel = torch.exp(-2.0 * torch.cdist(points[drawn], points[drawn]).square())
        pairs = drawn[:, None] != drawn[None]  # pairs of two different images
        assert float(replicate) == pytest.approx(math.log(float(kernel[pairs].mean())), abs=1e-10)


def test_uniformity_interval_is_recorded_and_survives_a_resumed_run(tmp_path):
    out = invariance(view_tap(make_views(n=50)))
    resamples = {VIEW_IMAGES: bootstrap_resamples(50, n_boot=200, seed=0)}
    record = tap_uncertainty(out.metrics, out.per_unit, resamples)
    assert record["uniform"]["ci95"][0] < out.metrics["uniform"] < record["uniform"]["ci95"][1]
    assert "recomputed on each resample" in record["uniform"]["method"]
    assert record["view_spread_rel"]["ci95"] is not None
    save_per_unit(tmp_path / "tap.safetensors", out.per_unit)
    loaded = load_per_unit(tmp_path / "tap.safetensors")
    assert isinstance(loaded["uniform"], Uniformity) and loaded["uniform"].t == 2.0
    # equal to float rounding: the loaded points are memory-mapped, which may take another kernel path on some CPUs
    torch.testing.assert_close(loaded["uniform"].replicates(resamples[VIEW_IMAGES]),
                               out.per_unit["uniform"].replicates(resamples[VIEW_IMAGES]), rtol=0, atol=1e-12)


def _coverage(draw, truth: float, t: float = 2.0, n: int = 150, reps: int = 200) -> float:
    g = torch.Generator().manual_seed(0)
    resamples = bootstrap_resamples(n, n_boot=400, seed=1)
    covered = 0
    for _ in range(reps):
        low, high = percentile_interval(Uniformity(draw(n, g), t, VIEW_IMAGES).replicates(resamples))
        covered += low <= truth <= high
    return covered / reps


def test_uniformity_interval_covers_the_true_value_of_a_bunched_cloud():
    # Normalised Gaussians around a common direction (bunched, like an offline backbone's features); the true
    # value from 10^6 independent pairs (its Monte Carlo error, ~5e-4, is far below the interval's width ~0.26).
    def draw(n, g):
        return sphere_points(torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
                             + torch.randn(n, 3, generator=g, dtype=torch.float64))

    g = torch.Generator().manual_seed(123)
    a, b = draw(1_000_000, g), draw(1_000_000, g)
    truth = math.log(float(torch.exp(-2.0 * (a - b).square().sum(dim=1)).mean()))
    assert 0.90 <= _coverage(draw, truth) <= 0.99  # 0.945 over 200 replications (binomial sd 0.016)


def test_uniformity_interval_is_conservative_for_the_uniform_distribution():
    # Uniform on S² (normalised isotropic Gaussians in 3-D): cos θ is uniform on [−1, 1], so E exp(−t‖z − z'‖²) =
    # (1 − e^{−4t}) / (4t) exactly. There every point has the same mean kernel (a degenerate U-statistic), its
    # error shrinks like 1/n, not 1/√n, and the bootstrap interval is wider than needed: it always covers.
    truth = math.log((1 - math.exp(-8.0)) / 8.0)
    assert _coverage(lambda n, g: sphere_points(torch.randn(n, 3, generator=g, dtype=torch.float64)), truth) >= 0.95


def _lidar_views(n: int, g: torch.Generator, k: int = 4) -> torch.Tensor:
    """Image means ~ N(0, diag(4, 1, 0.25)), views = mean + N(0, I): population Σ_b = diag(λ) + I/K, Σ_w = I."""
    scales = torch.tensor([2.0, 1.0, 0.5], dtype=torch.float64)
    return torch.randn(n, 1, 3, generator=g, dtype=torch.float64) * scales + torch.randn(n, k, 3, generator=g,
                                                                                        dtype=torch.float64)


def _weighted_lidar(views: torch.Tensor, w: torch.Tensor, delta: float = 1e-4, eps: float = 1e-8) -> float:
    """LiDAR with images weighted by w (summing to 1), written out independently of the probe."""
    n, k, d = views.shape
    means = views.mean(dim=1)
    centred = means - w @ means
    sigma_b = n / (n - 1) * (centred.T * w) @ centred
    within = views - means[:, None]
    sigma_w = torch.einsum("i,itd,ite->de", w, within, within) / (k - 1) + delta * torch.eye(d, dtype=torch.float64)
    inverse_sqrt = torch.linalg.inv(torch.linalg.cholesky(sigma_w))
    eigenvalues = torch.linalg.eigvalsh(inverse_sqrt @ sigma_b @ inverse_sqrt.T).clamp_min(0)
    p = eigenvalues / eigenvalues.sum() + eps
    return float(torch.exp(-(p * p.log()).sum()))


def test_lidar_pseudo_values_average_to_lidar_and_are_its_influence_per_image():
    views = _lidar_views(40, torch.Generator().manual_seed(0))
    u = lidar_pseudo_values(views)
    assert float(u.mean()) == pytest.approx(lidar(views), rel=1e-12)
    uniform_w = torch.full((40,), 1 / 40, dtype=torch.float64)
    for i in (0, 7, 39):  # d/dε LiDAR(w + ε(e_i − w)) at ε = 0, by central differences
        direction = -uniform_w.clone()
        direction[i] += 1
        h = 1e-6
        slope = (_weighted_lidar(views, uniform_w + h * direction)
                 - _weighted_lidar(views, uniform_w - h * direction)) / (2 * h)
        assert float(u[i] - u.mean()) == pytest.approx(slope, rel=1e-5, abs=1e-8)


def test_lidar_linearised_interval_covers_the_population_value():
    truth_eigenvalues = (torch.tensor([4.0, 1.0, 0.25], dtype=torch.float64) + 1 / 4) / (1 + 1e-4)
    p = truth_eigenvalues / truth_eigenvalues.sum() + 1e-8
    truth = float(torch.exp(-(p * p.log()).sum()))
    g, resamples, covered = torch.Generator().manual_seed(0), bootstrap_resamples(200, n_boot=400, seed=1), 0
    for _ in range(200):
        low, high = percentile_interval(Linearised(lidar_pseudo_values(_lidar_views(200, g)), VIEW_IMAGES)
                                        .replicates(resamples))
        covered += low <= truth <= high
    assert 0.90 <= covered / 200 <= 0.99  # 0.945 over 200 replications (binomial sd 0.016)


def test_lidar_interval_is_labelled_linearised_and_survives_a_resumed_run(tmp_path):
    out = invariance(view_tap(_lidar_views(60, torch.Generator().manual_seed(2))))
    record = tap_uncertainty(out.metrics, out.per_unit, {VIEW_IMAGES: bootstrap_resamples(60, 200, 0)})["lidar"]
    assert "linearised" in record["method"] and record["ci95"][0] < out.metrics["lidar"] < record["ci95"][1]
    save_per_unit(tmp_path / "tap.safetensors", out.per_unit)
    assert isinstance(load_per_unit(tmp_path / "tap.safetensors")["lidar"], Linearised)


def test_the_invariance_probe_s_lidar_is_spectrum_lidar():
    """The probe takes LiDAR as the mean of its pseudo-values (one eigen-decomposition for metric and interval)."""
    views = make_views(n=60, k=4, d=6, seed=4)
    out = invariance(view_tap(views))
    assert out.metrics["lidar"] == pytest.approx(lidar(views), rel=1e-12)
    assert out.per_unit["lidar"].value() == pytest.approx(out.metrics["lidar"], rel=1e-15)
