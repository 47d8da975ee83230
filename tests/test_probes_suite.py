"""view_mi and augment_r2 against known answers: Gaussian views of known MI, parameters that are noisy linear
functions of the features, and the grouped ridge cross-validation against sklearn refits."""

import math

import numpy as np
import pytest
import torch

from headprobe.data.augment import PARAM_NAMES
from headprobe.probes.builtin.augment_r2 import AUG_R2_ALPHAS, grouped_ridge_cv, ridge_predictions
from headprobe.probes.builtin.augment_r2 import AUGMENT_R2 as augment_r2
from headprobe.probes.builtin.view_mi import VIEW_MI as view_mi
from headprobe.probes.tap_data import TapData

pytestmark = pytest.mark.usefixtures("single_thread")


def make_tap(views, params=None, **kw):
    empty, labels = torch.zeros(2, views.shape[-1]), torch.zeros(2, dtype=torch.long)
    return TapData("backbone", empty, labels, empty, labels, 2, views=views, view_params=params, **kw)


def paired_views(n, dim, mi, seed):
    """Two views (n, 2, dim), jointly Gaussian with per-coordinate correlation ρ: I(view0; view1) = mi nats."""
    g = torch.Generator().manual_seed(seed)
    rho = math.sqrt(1 - math.exp(-2 * mi / dim))
    x = torch.randn(n, dim, generator=g, dtype=torch.float64)
    y = rho * x + math.sqrt(1 - rho**2) * torch.randn(n, dim, generator=g, dtype=torch.float64)
    mix = torch.randn(dim, dim, generator=g, dtype=torch.float64)  # an invertible map: MI unchanged
    return torch.stack([x @ mix, y @ mix], dim=1)


# D = k, so view_mi's PCA is an invertible map of each view and the true MI of the components is exactly `mi`.
# Old code (Ledoit–Wolf on the joint matrix) gave 0.04 / 0.5 / 9.2 at N = 200 (δ → 1 erases the cross term).
@pytest.mark.parametrize(("n", "dim", "mi", "tolerance"), [
    (200, 20, 0.5, 0.4), (200, 20, 2.0, 0.55), (200, 20, 24.9, 0.9), (1000, 32, 2.0, 0.25), (1000, 32, 24.9, 0.6),
])
def test_view_mi_gaussian_recovers_the_known_mi_at_small_n(n, dim, mi, tolerance):
    out = view_mi(make_tap(paired_views(n, dim, mi, seed=3).float()), batch_size=64)
    gaussian = out.protocol["gaussian"]
    assert gaussian["pca_dims"] == min(32, dim, n // 10) == dim
    assert out.metrics["mi.gaussian"] == pytest.approx(mi, abs=tolerance)
    assert out.metrics["mi.gaussian"] > mi / 3 > 0
    assert gaussian["shrinkage"] == 0.0 and "erases" in gaussian["shrinkage_why"]
    assert gaussian["bias_correction"] > 0 and gaussian["mi_plugin"] > out.metrics["mi.gaussian"]


def test_view_mi_gaussian_is_not_zero_for_weakly_dependent_views():
    # The regime of the quickstart (N = 200, 20 components, weak dependence), where the old value was exactly -0.0.
    values = [view_mi(make_tap(paired_views(200, 20, 0.5, seed)), batch_size=64).metrics["mi.gaussian"]
              for seed in range(5)]
    assert min(values) > 0.1 and abs(np.mean(values) - 0.5) < 0.2


def regression_views(n_images=80, views=4, dim=200, seed=0, scale=1.0, feature_noise=2.0):
    """Features (n, K, dim): 5 latent factors spread over `dim` features plus isotropic noise, times `scale`;
    parameters (n, K, P): crop_x is a noisy linear function of the factors (best R² 0.9), solarize is
    constant, every other parameter is independent noise."""
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=(n_images, views, 5))
    x = latent @ rng.normal(size=(5, dim)) + feature_noise * rng.normal(size=(n_images, views, dim))
    params = rng.uniform(size=(n_images, views, len(PARAM_NAMES)))
    signal = latent @ np.array([1.0, -1.0, 0.5, 0.5, 1.0])
    params[..., PARAM_NAMES.index("crop_x")] = signal + rng.normal(size=signal.shape) * math.sqrt(signal.var() / 9)
    params[..., PARAM_NAMES.index("solarize")] = 0.0
    return torch.tensor(x * scale), torch.tensor(params)


def test_augment_r2_chooses_alpha_on_train_and_recovers_a_linear_parameter():
    views, params = regression_views(scale=1e-4)  # tiny-scale features: standardisation must undo it
    out = augment_r2(make_tap(views, params))
    # 60 training images × 4 views = 240 rows for 200 noisy features: alpha = 1 nearly interpolates the noise
    # (measured: crop_x 0.38 and noise parameters down to -4.3 with alpha = 1; 0.85 and > -0.05 with CV).
    from sklearn.linear_model import Ridge
    from sklearn.metrics import r2_score
    from sklearn.preprocessing import StandardScaler

    order = torch.randperm(80, generator=torch.Generator().manual_seed(0))
    test, train = order[:20], order[20:]
    j = PARAM_NAMES.index("crop_x")
    scaler = StandardScaler().fit(views[train].reshape(-1, 200))
    fixed = Ridge(alpha=1.0).fit(scaler.transform(views[train].reshape(-1, 200)), params[train, :, j].reshape(-1))
    r2_fixed = r2_score(params[test, :, j].reshape(-1), fixed.predict(scaler.transform(views[test].reshape(-1, 200))))
    assert r2_fixed < 0.5, "the case must be one where the old fixed alpha = 1 is badly wrong"
    assert out.metrics["aug_r2.crop_x"] > 0.75 > r2_fixed + 0.25
    assert out.protocol["alpha"]["crop_x"] > 1.0 and out.protocol["alpha_grid"] == sorted(AUG_R2_ALPHAS)
    assert set(out.protocol["alpha"]) == set(out.protocol["params"])
    # Noise parameters get R² close to 0 (not strongly negative as with alpha = 1).
    assert all(out.metrics[f"aug_r2.{p}"] > -0.1 for p in out.protocol["params"])


def test_augment_r2_skips_constant_and_inert_parameters_and_leaves_them_out_of_the_mean():
    views, params = regression_views(n_images=40, dim=20)
    out = augment_r2(make_tap(views, params, inert_params={"hue": "grey images"}))
    skipped = out.protocol["skipped"]
    assert "never varies" in skipped["solarize"] and "grey images" in skipped["hue"]
    assert "aug_r2.solarize" not in out.metrics and "aug_r2.hue" not in out.metrics
    used = out.protocol["params"]
    assert set(used) == set(PARAM_NAMES) - {"solarize", "hue"}
    assert out.metrics["aug_r2.mean"] == pytest.approx(np.mean([out.metrics[f"aug_r2.{p}"] for p in used]))


def test_augment_r2_with_every_parameter_constant_reports_no_mean():
    views, params = regression_views(n_images=20, dim=10)
    out = augment_r2(make_tap(views, torch.zeros_like(params)))
    assert out.metrics == {} and set(out.protocol["skipped"]) == set(PARAM_NAMES)


def testgrouped_ridge_cv_matches_sklearn_refits_fold_by_fold():
    from sklearn.linear_model import Ridge
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(1)
    x = rng.normal(size=(36, 7)) * rng.uniform(0.1, 10, size=7)
    x[:, 3] = 2.5  # a constant feature is only centred
    y = rng.normal(size=(36, 2)) + x[:, :1]
    groups, alphas, folds = np.repeat(np.arange(12), 3), [0.01, 1.0, 100.0], 4
    got = grouped_ridge_cv(x, y, groups, alphas, folds, seed=5)
    # Same fold assignment as the probe: a seeded permutation of the groups, dealt round-robin.
    order = np.random.default_rng(5).permutation(np.arange(12)).tolist()
    fold_of = dict(zip(order, np.arange(12) % folds, strict=True))
    fold = np.array([fold_of[g] for g in groups])
    assert all(len(set(fold[groups == g])) == 1 for g in range(12)), "an image's views share one fold"
    expected = np.zeros((3, 2))
    for f in range(folds):
        fit, val = fold != f, fold == f
        scaler = StandardScaler().fit(x[fit])
        for i, alpha in enumerate(alphas):
            pred = Ridge(alpha=alpha).fit(scaler.transform(x[fit]), y[fit]).predict(scaler.transform(x[val]))
            expected[i] += ((pred - y[val]) ** 2).sum(0)
    np.testing.assert_allclose(got, expected / len(x), rtol=1e-8)


def relu_tap_views(n_images=337, views=4, dim=512, seed=0):
    """A ReLU head's views at the quickstart's scale: 384-d correlated features through a random 512-wide layer
    and a ReLU (units dead on most rows make the standardised features ill-conditioned), parameters linear in a few
    directions plus noise."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n_images * views, 384)) @ rng.normal(size=(384, 384)) / 20
    x = np.maximum(base @ rng.normal(size=(384, dim)) / 20 - np.linspace(0, 4.5, dim), 0)  # later units die
    y = base[:, :6] @ rng.normal(size=(6, 14)) + rng.normal(size=(n_images * views, 14))
    return x, y, np.repeat(np.arange(n_images), views)


def testgrouped_ridge_cv_matches_an_svd_reference_at_the_quickstart_scale():
    x, y, groups = relu_tap_views()
    grid = sorted(AUG_R2_ALPHAS)
    got = grouped_ridge_cv(x, y, groups, grid, 5, seed=0)
    order = np.random.default_rng(0).permutation(np.unique(groups)).tolist()
    fold_of = dict(zip(order, np.arange(len(order)) % 5, strict=True))
    fold = np.array([fold_of[g] for g in groups])
    expected = np.zeros_like(got)
    for f in range(5):  # the same protocol through an SVD of the standardised fitting part
        fit, val = fold != f, fold == f
        mean, std = x[fit].mean(0), x[fit].std(0)
        std[std <= 1e-12 * np.maximum(np.abs(mean), 1.0)] = 1.0
        xf, xv = (x[fit] - mean) / std, (x[val] - mean) / std
        u, sv, vt = np.linalg.svd(xf, full_matrices=False)
        for i, alpha in enumerate(grid):
            coef = vt.T @ ((sv / (sv**2 + alpha))[:, None] * (u.T @ (y[fit] - y[fit].mean(0))))
            expected[i] += ((xv @ coef + y[fit].mean(0) - y[val]) ** 2).sum(0)
    expected /= len(x)
    rel = np.abs(got - expected) / expected
    assert (std := x.std(0)).min() == 0 and (std > 0).sum() > 100, "dead and live units, as on a ReLU tap"
    # The error bound ε·λ_max/α: ~1e-8 at the smallest α, rounding from α = 1e3 (where near-ties are decided).
    assert rel.max() < 1e-6
    assert rel[[i for i, a in enumerate(grid) if a >= 1e3]].max() < 1e-12
    best = [max(i for i in range(len(grid)) if m[i, t] <= m[:, t].min() * (1 + 1e-12)) for m in (got, expected)
            for t in range(y.shape[1])]
    assert best[: y.shape[1]] == best[y.shape[1] :]


def testridge_predictions_match_sklearn_per_target_at_the_quickstart_scale():
    from sklearn.linear_model import Ridge
    from sklearn.preprocessing import StandardScaler

    x, y, _ = relu_tap_views(n_images=450)  # 337 training images × 4 views, 113 held out
    fit, held_out = x[:1348], x[1348:]
    scaler = StandardScaler().fit(fit)
    xs, xt = scaler.transform(fit), scaler.transform(held_out)
    alphas = [AUG_R2_ALPHAS[(3 * t) % len(AUG_R2_ALPHAS)] for t in range(y.shape[1])]
    got = ridge_predictions(xs, y[:1348], xt, alphas)
    for t, alpha in enumerate(alphas):
        expected = Ridge(alpha=alpha).fit(xs, y[:1348, t]).predict(xt)
        np.testing.assert_allclose(got[:, t], expected, rtol=1e-7, atol=1e-9 * np.abs(expected).max())


def test_spectrum_of_collapsed_features_keeps_what_is_defined_instead_of_failing():
    from headprobe.probes.builtin.spectrum import SPECTRUM as spectrum
    from headprobe.probes.tap_data import TapData

    g = torch.Generator().manual_seed(0)
    rank_one = torch.outer(torch.randn(200, generator=g), torch.randn(16, generator=g)).double()
    labels = torch.zeros(200, dtype=torch.long)
    out = spectrum(TapData("t", rank_one, labels, rank_one[:10], labels[:10], 1))
    assert "alpha_req" not in out.metrics and "resolved eigenvalues" in out.protocol["undefined"]["alpha_req"]
    assert out.metrics["rankme"] == pytest.approx(1.0, abs=1e-3) and out.metrics["cond"] == pytest.approx(1.0)
    dead = torch.zeros(50, 8)  # a dead ReLU head
    out = spectrum(TapData("t", dead, labels[:50], dead[:5], labels[:5], 1))
    assert out.metrics == {} and set(out.protocol["undefined"]) == {"rankme", "alpha_req", "cond"}


def test_spectrum_probe_shares_one_decomposition_and_equals_the_functions_called_alone():
    from headprobe.probes.builtin.spectrum import SPECTRUM as spectrum
    from headprobe.probes.spectrum import alpha_req, covariance_spectrum, rankme

    x, _, _ = relu_tap_views(n_images=100)
    z = torch.tensor(x, dtype=torch.float32)
    labels = torch.zeros(len(z), dtype=torch.long)
    out = spectrum(TapData("t", z, labels, z[:10], labels[:10], 1))
    alone = covariance_spectrum(z)
    assert out.metrics == {"rankme": rankme(z), "alpha_req": alpha_req(z), "cond": alone["condition_number"],
                           "eff_rank": alone["effective_rank"]}
    assert out.protocol["eigenvalues_top"] == list(alone["eigenvalues"][:64])

