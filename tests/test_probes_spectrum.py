import math

import numpy as np
import pytest
import scipy.linalg
import scipy.special
import torch

from headprobe.probes.spectrum import alpha_req, alpha_req_fit_range, covariance_spectrum, lidar, rankme
from headprobe.probes.view_geometry import alignment, uniformity, view_cosine

pytestmark = pytest.mark.usefixtures("single_thread")


def generator(seed=0):
    return torch.Generator().manual_seed(seed)


def with_exact_covariance(eigenvalues, n, seed=0):
    """(n, D) float64 samples whose unbiased sample covariance has exactly these eigenvalues (random basis)."""
    d = len(eigenvalues)
    g = generator(seed)
    noise = torch.randn(n, d, generator=g, dtype=torch.float64)
    scores, _ = torch.linalg.qr(noise - noise.mean(dim=0))  # orthonormal columns, each orthogonal to 1
    basis, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return scores * (torch.as_tensor(eigenvalues, dtype=torch.float64) * (n - 1)).sqrt() @ basis.T


def test_rankme_matches_the_formula_and_counts_dimensions():
    g = generator()
    isotropic = torch.randn(2000, 16, generator=g)
    sigma = np.linalg.svd(isotropic.double().numpy(), compute_uv=False)
    p = sigma / sigma.sum() + 1e-7
    assert rankme(isotropic) == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-9)
    assert rankme(isotropic) == pytest.approx(16, abs=0.1)
    subspace, _ = torch.linalg.qr(torch.randn(32, 4, generator=g))
    rank_four = torch.randn(2000, 4, generator=g) @ subspace.T
    assert rankme(rank_four) == pytest.approx(4, abs=0.05)


def lda_views(n=100, k=8, d=16, informative=16, seed=0):
    """Images whose means differ in the first `informative` dims (std 3) with augmentation noise 0.3 there and
    pure augmentation noise of std 3 in the remaining dims."""
    g = generator(seed)
    means = torch.zeros(n, 1, d, dtype=torch.float64)
    means[..., :informative] = 3 * torch.randn(n, 1, informative, generator=g, dtype=torch.float64)
    noise_std = torch.cat([torch.full((informative,), 0.3), torch.full((d - informative,), 3.0)]).double()
    return means + noise_std * torch.randn(n, k, d, generator=g, dtype=torch.float64)


def test_lidar_matches_generalised_eigenvalues():
    views = lda_views(n=30, k=4, d=6, informative=3)
    v = views.numpy()
    class_means = v.mean(axis=1)
    between = np.cov(class_means, rowvar=False)
    centred = (v - class_means[:, None]).reshape(-1, 6)
    within = centred.T @ centred / (30 * 3) + 1e-4 * np.eye(6)
    # Eigenvalues of Σ_w^{-1/2} Σ_b Σ_w^{-1/2} are the generalised eigenvalues of (Σ_b, Σ_w).
    eigenvalues = np.clip(scipy.linalg.eigh(between, within, eigvals_only=True), 0, None)
    p = eigenvalues / eigenvalues.sum() + 1e-8
    assert lidar(views) == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-9)


def test_lidar_counts_discriminative_directions_where_rankme_counts_variance():
    separated = lda_views(informative=16)
    three_informative = lda_views(informative=3)
    assert lidar(separated) > 12
    # Thirteen high-variance directions carry only augmentation noise: LiDAR ignores them, RankMe cannot.
    assert 3 <= lidar(three_informative) < 3.5
    assert rankme(three_informative.reshape(-1, 16)) > 15


def test_lidar_is_scale_free_so_pure_noise_scores_high():
    g = generator()
    noise = torch.randn(100, 8, 16, generator=g, dtype=torch.float64)
    # Σ_b ≈ Σ_w / K, isotropic after whitening: as high as well-separated images. Compare models, not values to D.
    assert lidar(noise) > 12
    assert lidar(100 * noise) == pytest.approx(lidar(noise), rel=1e-3)


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
def test_alpha_req_recovers_the_power_law(alpha):
    spectrum = torch.arange(1, 33, dtype=torch.float64) ** -alpha
    assert alpha_req(with_exact_covariance(spectrum, n=200)) == pytest.approx(alpha, abs=1e-9)
    basis, _ = torch.linalg.qr(torch.randn(32, 32, generator=generator(1), dtype=torch.float64))
    sampled = torch.randn(4000, 32, generator=generator(2), dtype=torch.float64) * spectrum.sqrt() @ basis
    assert alpha_req(sampled) == pytest.approx(alpha, abs=0.05)
    assert alpha_req(sampled, fit_range=(1, 16)) == pytest.approx(alpha, abs=0.05)


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
def test_alpha_req_default_range_recovers_sampled_power_laws_at_the_scale_used(alpha):
    # N = 4096 samples of D = 256 dims, randomly rotated: the full resolved range read 0.563 for 0.5 (the tail
    # of the sample spectrum bends down); the default head half must be within 2%.
    n, d = 4096, 256
    spectrum = torch.arange(1, d + 1, dtype=torch.float64) ** -alpha
    basis, _ = torch.linalg.qr(torch.randn(d, d, generator=generator(3), dtype=torch.float64))
    sampled = torch.randn(n, d, generator=generator(4), dtype=torch.float64) * spectrum.sqrt() @ basis
    assert alpha_req_fit_range(sampled) == (1, 128)
    assert alpha_req(sampled) == pytest.approx(alpha, rel=0.02)
    assert alpha_req(sampled, fit_range=(1, d)) > alpha * 1.01  # what the old default read: biased steep


def test_alpha_req_fits_only_resolved_eigenvalues():
    spectrum = torch.arange(1, 11, dtype=torch.float64) ** -1.5
    low_rank = torch.cat([with_exact_covariance(spectrum, n=50), torch.zeros(50, 30, dtype=torch.float64)], dim=1)
    assert alpha_req(low_rank) == pytest.approx(1.5, abs=1e-9)
    with pytest.raises(ValueError, match="resolved"):
        alpha_req(low_rank, fit_range=(1, 20))


def test_alignment_and_view_cosine():
    g = generator()
    z = torch.randn(50, 8, generator=g)
    assert alignment(z, 3 * z) == pytest.approx(0, abs=1e-12)
    assert alignment(z, -z) == pytest.approx(4) and alignment(z, -z, alpha=1) == pytest.approx(2)
    other = torch.randn(50, 8, generator=g)
    unit = torch.nn.functional.normalize
    expected = (unit(z.double(), dim=1) - unit(other.double(), dim=1)).norm(dim=1).pow(2).mean()
    assert alignment(z, other) == pytest.approx(float(expected), rel=1e-12)
    # On the sphere ‖u − v‖² = 2 − 2 cos(u, v), so the two measures must agree.
    assert view_cosine(z, other) == pytest.approx(1 - alignment(z, other) / 2, rel=1e-12)
    assert view_cosine(z, z) == pytest.approx(1)


def test_uniformity_of_two_antipodal_clusters_by_hand():
    n = 50
    z = torch.cat([torch.tensor([[1.0, 0.0, 0.0]]).expand(n, 3), torch.tensor([[-2.0, 0.0, 0.0]]).expand(n, 3)])
    # n(n−1) within-cluster pairs at distance 0 and n² cross pairs at squared distance 4, of n(2n−1) pairs.
    expected = math.log((n * (n - 1) + n * n * math.exp(-8)) / (n * (2 * n - 1)))
    assert uniformity(z) == pytest.approx(expected, rel=1e-12)


def test_uniformity_on_the_circle_matches_the_bessel_closed_form():
    n = 200
    angles = torch.arange(n, dtype=torch.float64) * 2 * math.pi / n
    circle = torch.stack([angles.cos(), angles.sin()], dim=1)
    # E exp(−2‖u − v‖²) = e^{−4} I₀(4) for uniform u, v on S¹; the n equispaced points integrate it exactly
    # (up to ~1e-60), and dropping the n self-pairs (each worth 1) leaves the distinct-pair mean.
    over_all_pairs = math.exp(-4) * scipy.special.i0(4)
    expected = math.log((n * over_all_pairs - 1) / (n - 1))
    assert uniformity(circle) == pytest.approx(expected, rel=1e-10)
    assert uniformity(circle, chunk_size=7) == pytest.approx(uniformity(circle), rel=1e-12)


def test_uniform_points_are_more_uniform_than_a_cluster():
    g = generator()
    sphere = torch.randn(1000, 3, generator=g, dtype=torch.float64)
    cluster = torch.tensor([0.0, 0.0, 1.0]) + 0.2 * torch.randn(1000, 3, generator=g, dtype=torch.float64)
    # Uniform on S²: ‖u − v‖² = 2 − 2w with w ~ U[−1, 1], so E exp(−2‖u − v‖²) = (1 − e^{−8}) / 8.
    assert uniformity(sphere) == pytest.approx(math.log((1 - math.exp(-8)) / 8), abs=0.03)
    assert uniformity(sphere) < uniformity(cluster) < 0
    assert uniformity(torch.ones(5, 3)) == pytest.approx(0, abs=1e-12)


def test_covariance_spectrum_matches_numpy_with_enough_samples():
    z = torch.randn(400, 12, generator=generator(), dtype=torch.float64) * torch.linspace(0.5, 3, 12)
    result = covariance_spectrum(z)
    reference = np.linalg.eigvalsh(np.cov(z.numpy(), rowvar=False))[::-1]
    np.testing.assert_allclose(result["eigenvalues"], reference, rtol=1e-10)
    assert result["condition_number"] == pytest.approx(reference[0] / reference[-1], rel=1e-10)
    assert result["condition_number_scope"] == "full" and "fewer than" not in result["note"]
    flat = covariance_spectrum(with_exact_covariance(torch.ones(12), n=50))
    assert flat["effective_rank"] == pytest.approx(12) and flat["participation_ratio"] == pytest.approx(12)
    assert flat["condition_number"] == pytest.approx(1) and "fewer than 10 samples" in flat["note"]


def test_covariance_spectrum_does_not_clamp_when_samples_are_fewer_than_dimensions():
    z = torch.randn(64, 128, generator=generator())
    result = covariance_spectrum(z)
    naive = max(result["eigenvalues"]) / 1e-7  # what clamping λ_min = 0 to 1e-7 would report
    assert naive > 1e7 and result["condition_number"] < 100
    assert result["condition_number_scope"] == "top_k" and result["top_k"] == 6 and result["rank_limit"] == 63
    assert "64 samples in 128 dimensions" in result["note"] and "top 6" in result["note"]
    assert result["n_samples"] == 64 and result["dim"] == 128 and len(result["eigenvalues"]) == 64
    chosen = covariance_spectrum(z, top_k=10)
    assert chosen["condition_number"] == pytest.approx(result["eigenvalues"][0] / result["eigenvalues"][9])
    with pytest.raises(ValueError, match="top_k"):
        covariance_spectrum(z, top_k=64)


def test_covariance_spectrum_reports_a_rank_deficient_subspace():
    g = generator()
    z = torch.randn(500, 5, generator=g, dtype=torch.float64) @ torch.randn(5, 20, generator=g, dtype=torch.float64)
    result = covariance_spectrum(z)
    assert result["numerical_rank"] == 5 == result["top_k"] and result["condition_number"] < 1e3
    assert "span only 5 of 20" in result["note"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: rankme(torch.zeros(3)), "2-D"),
        (lambda: rankme(torch.tensor([[1.0, float("nan")]])), "NaN"),
        (lambda: lidar(torch.zeros(4, 6)), "3-D"),
        (lambda: lidar(torch.randn(5, 1, 3)), "at least 2"),
        (lambda: alignment(torch.ones(3, 2), torch.ones(4, 2)), "shape"),
        (lambda: view_cosine(torch.zeros(2, 2), torch.ones(2, 2)), "all zeros"),
        (lambda: uniformity(torch.ones(1, 3)), "N ≥ 2"),
        (lambda: covariance_spectrum(torch.ones(5, 3)), "identical"),
        (lambda: alpha_req(torch.randn(10, 4), fit_range=(3, 2)), "fit_range"),
    ],
)
def test_bad_input_fails_with_a_sentence(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("n", [32, 64, 120, 128, 129, 256, 1280])
def test_isotropic_features_read_well_conditioned_at_any_sample_size(n):
    # True condition number 1. The smallest resolved sample eigenvalue heads to 0 as N nears D (λ_1/λ_min was
    # 4e5 at N = D = 128), so the default uses only the eigenvalues with >= 10 samples each.
    z = torch.randn(n, 128, generator=generator(), dtype=torch.float64)
    result = covariance_spectrum(z)
    assert result["condition_number"] < 5, result["note"]
    assert result["condition_number_scope"] == ("top_k" if n < 1280 else "full")
    if n in (128, 129):
        assert result["condition_number_all_resolved"] > 1e3  # what the full spectrum would have claimed


def test_float32_rounding_is_not_counted_as_rank_even_in_float64():
    g = generator()
    low = torch.randn(400, 3, generator=g) @ torch.randn(3, 20, generator=g)  # float32 products: rank 3 + rounding
    assert covariance_spectrum(low)["numerical_rank"] == 3 == covariance_spectrum(low.double())["numerical_rank"]


def test_sphere_measures_do_not_overflow_at_extreme_scales():
    z = torch.randn(10, 4, generator=generator(), dtype=torch.float64)
    for scale in (1e-200, 1e200):
        assert uniformity(scale * z) == pytest.approx(uniformity(z), rel=1e-12)
        assert view_cosine(scale * z, scale * z) == pytest.approx(1.0, rel=1e-12)
