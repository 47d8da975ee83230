import math

import numpy as np
import pytest
import torch

from headprobe.probes.information import (
    CriticFit,
    InfoNCEBound,
    SeparableCritic,
    cosine_critic,
    dv_bound,
    gaussian_mi,
    infonce_bound,
    mutual_information,
    nwj_bound,
    smile_bound,
    train_critic,
)
from headprobe.probes.label_mi import label_mi_lower_bound

pytestmark = pytest.mark.usefixtures("single_thread")


def correlated_gaussians(n, dim, mi, seed=0):
    """x, y ~ N(0, I_dim) with per-coordinate correlation ρ = sqrt(1 − e^{−2 mi / dim}), so I(x; y) = mi nats."""
    g = torch.Generator().manual_seed(seed)
    rho = math.sqrt(1 - math.exp(-2 * mi / dim))
    x = torch.randn(n, dim, generator=g, dtype=torch.float64)
    y = rho * x + math.sqrt(1 - rho**2) * torch.randn(n, dim, generator=g, dtype=torch.float64)
    return x, y, rho


def optimal_critic(x, y, rho):
    """scores[i, j] = log p(y_j | x_i) / p(y_j) for the Gaussians above: the critic every bound is tight for."""
    s2 = 1 - rho**2
    residual = y[None] - rho * x[:, None]
    return (-residual.square() / (2 * s2) - 0.5 * math.log(s2) + y[None].square() / 2).sum(-1)


def batch_scores(mi, batch_size=128, n_batches=30, dim=4, seed=0):
    x, y, rho = correlated_gaussians(batch_size * n_batches, dim, mi, seed)
    return [
        optimal_critic(x[i : i + batch_size], y[i : i + batch_size], rho) for i in range(0, len(x), batch_size)
    ]


def mean_and_stderr(values):
    values = np.asarray(values)
    return values.mean(), values.std(ddof=1) / math.sqrt(len(values))


def test_bounds_match_hand_computation():
    scores = torch.tensor([[2.0, 0.5, -1.0], [0.0, 1.0, 3.0], [1.5, -2.0, 4.0]], dtype=torch.float64)
    s = scores.numpy()
    off = s[~np.eye(3, dtype=bool)]
    infonce = np.mean(np.diag(s) - np.log(np.exp(s).sum(1))) + np.log(3)
    assert infonce_bound(scores) == pytest.approx(InfoNCEBound(infonce, math.log(3)), abs=1e-12)
    assert nwj_bound(scores) == pytest.approx(np.diag(s).mean() - np.exp(off - 1).mean(), abs=1e-12)
    assert dv_bound(scores) == pytest.approx(np.diag(s).mean() - np.log(np.exp(off).mean()), abs=1e-12)
    clipped = np.clip(off, -1.0, 1.0)
    assert smile_bound(scores, clip=1.0) == pytest.approx(np.diag(s).mean() - np.log(np.exp(clipped).mean()), abs=1e-12)


def test_infonce_never_exceeds_log_batch_size():
    g = torch.Generator().manual_seed(0)
    for b in (2, 7, 64):
        for scale in (0.1, 10.0, 1000.0):
            value, ceiling = infonce_bound(scale * torch.randn(b, b, generator=g))
            assert ceiling == math.log(b) and value <= ceiling + 1e-12
    # A critic that singles out every positive reaches the ceiling exactly.
    assert infonce_bound(100 * torch.eye(16, dtype=torch.float64)).value == pytest.approx(math.log(16), abs=1e-12)


@pytest.mark.parametrize("mi", [1.0, 2.0, 8.0])
def test_bounds_with_the_optimal_critic_against_the_true_mi(mi):
    batches = batch_scores(mi)
    infonce, infonce_se = mean_and_stderr([infonce_bound(s).value for s in batches])
    # The NWJ optimum is shifted by one nat: f* = 1 + log p(y|x)/p(y).
    nwj, nwj_se = mean_and_stderr([nwj_bound(s + 1) for s in batches])
    assert infonce <= min(mi, math.log(128)) + 2 * infonce_se
    if mi >= 8:
        assert infonce > math.log(128) - 0.1, "InfoNCE saturates at log B when I ≫ log B"
    else:
        assert infonce > mi - 0.1, "InfoNCE is nearly tight for I well below log B"
        # Above log B the variance of NWJ (∝ e^I) is too heavy-tailed for 30 batches to pin its mean down.
        assert abs(nwj - mi) < 3 * nwj_se + 0.02, "NWJ is unbiased at its optimal critic"
    for s in batches:
        assert nwj_bound(s) <= dv_bound(s) + 1e-12, "log u ≤ u/e makes DV ≥ NWJ for one and the same critic"


def test_smile_equals_dv_when_nothing_is_clipped():
    scores = batch_scores(2.0, n_batches=1)[0]
    assert smile_bound(scores, clip=scores.abs().max().item() + 1) == pytest.approx(dv_bound(scores), abs=1e-12)
    assert smile_bound(scores, clip=5.0) != pytest.approx(dv_bound(scores), abs=1e-3)


def test_cosine_critic_is_scaled_cosine_similarity():
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g)
    expected = torch.tensor(
        [[float(torch.nn.functional.cosine_similarity(a, b, dim=0)) / 0.2 for b in z2] for a in z1]
    )
    torch.testing.assert_close(cosine_critic(z1, z2, temperature=0.2), expected)


@pytest.mark.parametrize("mi", [0.5, 2.0, 5.0])
def test_gaussian_mi_recovers_the_true_mi(mi):
    x, y, _ = correlated_gaussians(5000, 4, mi)
    result = gaussian_mi(x, y)
    # The estimate's sampling std at n = 5000 is 0.015-0.031 nats (measured over 40 seeds); allow ~4σ.
    assert result["mi"] == pytest.approx(mi, abs=0.08)
    assert result["shrinkage"] == 0.0 and result["warning"] is None
    assert result["n_samples"] == 5000 and result["dims"] == [4, 4] and result["units"] == "nats"


def wishart_bias(n, dx, dy):
    """E[plug-in MI] − MI for n Gaussian rows, from E log det A = log det Σ + p log 2 + Σ_{i≤p} ψ((ν−i+1)/2),
    A ~ Wishart_p(ν = n − 1, Σ), written independently of the package (scipy's digamma)."""
    from scipy.special import digamma

    def expected_logdet_offset(p):
        return p * math.log(2 / (n - 1)) + sum(digamma((n - 1 - i + 1) / 2) for i in range(1, p + 1))

    return 0.5 * (expected_logdet_offset(dx) + expected_logdet_offset(dy) - expected_logdet_offset(dx + dy))


def test_gaussian_mi_equals_the_log_determinant_formula():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 3, generator=g, dtype=torch.float64) * torch.tensor([1.0, 10.0, 0.1], dtype=torch.float64)
    y = torch.cat([x @ torch.randn(3, 2, generator=g, dtype=torch.float64), torch.ones(300, 1)], dim=1)
    y = y + torch.randn(300, 3, generator=g, dtype=torch.float64)
    y[:, 2] = 7.0
    joint = np.cov(np.concatenate([x.numpy(), y[:, :2].numpy()], axis=1), rowvar=False)
    logdet = lambda m: np.linalg.slogdet(m)[1]  # noqa: E731
    expected = 0.5 * (logdet(joint[:3, :3]) + logdet(joint[3:, 3:]) - logdet(joint))
    result = gaussian_mi(x, y, shrinkage=None)
    assert result["mi_plugin"] == pytest.approx(expected, rel=1e-9)
    # The constant column of y is dropped before the correction, so it is the one for 3 + 2 dimensions.
    assert result["bias_correction"] == pytest.approx(wishart_bias(300, 3, 2), rel=1e-9)
    assert result["mi"] == pytest.approx(expected - wishart_bias(300, 3, 2), rel=1e-9)
    assert result["constant_dims_dropped"] == {"x": 0, "y": 1} and result["dims"] == [3, 3]
    assert len(result["canonical_correlations"]) == 2
    uncorrected = gaussian_mi(x, y, shrinkage=None, bias_correction=False)
    assert uncorrected["mi"] == uncorrected["mi_plugin"] == result["mi_plugin"]
    assert uncorrected["bias_correction"] == 0.0 and "off" in uncorrected["bias_correction_source"]


def test_the_bias_correction_is_the_mean_plug_in_error_over_many_gaussian_samples():
    # Monte Carlo check of the exact expectation: 400 draws of N = 40 rows in 4 + 4 dims, true MI 1 nat.
    n, dim, mi = 40, 4, 1.0
    plugins = [gaussian_mi(*correlated_gaussians(n, dim, mi, seed)[:2], shrinkage=None)["mi_plugin"]
               for seed in range(400)]
    mean, stderr = mean_and_stderr(plugins)
    assert mean - mi == pytest.approx(wishart_bias(n, dim, dim), abs=4 * stderr)
    assert wishart_bias(n, dim, dim) > 10 * stderr  # the bias is real, not noise


# Spread of gaussian_mi's estimate over 20 seeds (measured): N=200, k=20: 0.07 (MI 0), 0.10 (0.5), 0.14 (2),
# 0.22 (24.9); N=1000, k=32: 0.02, 0.04, 0.06, 0.14. Tolerances are ~4 of those. Before the fix, shrinkage="auto"
# used Ledoit–Wolf at these sizes and gave 0.04 / 0.53 / 9.2 nats at N=200 (truth 0.5 / 2 / 24.9).
@pytest.mark.parametrize(("n", "k", "mi", "tolerance"), [
    (200, 20, 0.5, 0.4), (200, 20, 2.0, 0.55), (200, 20, 24.9, 0.9),
    (1000, 32, 0.5, 0.16), (1000, 32, 2.0, 0.25), (1000, 32, 24.9, 0.6),
])
def test_gaussian_mi_at_the_sizes_view_mi_uses_recovers_the_known_mi(n, k, mi, tolerance):
    for seed in (0, 1):
        x, y, _ = correlated_gaussians(n, k, mi, seed=10 + seed)
        result = gaussian_mi(x, y)
        assert result["mi"] == pytest.approx(mi, abs=tolerance)
        assert result["mi"] > mi / 3 > 0, "dependent data must never read as (near) zero MI"
        assert result["shrinkage"] == 0.0 and result["bias_correction"] > 0
        assert result["mi_plugin"] > result["mi"]


def test_gaussian_mi_with_few_samples_corrects_the_bias_and_warns():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(60, 10, generator=g), torch.randn(60, 10, generator=g)  # independent: true MI is 0
    plain, auto = gaussian_mi(x, y, shrinkage=None, bias_correction=False), gaussian_mi(x, y)
    assert plain["mi"] > 0.6, "plug-in canonical correlations of 60 samples in 10 + 10 dims are far from 0"
    assert abs(auto["mi"]) < 0.4 and auto["mi"] == pytest.approx(plain["mi"] - wishart_bias(60, 10, 10))
    assert auto["shrinkage"] == 0.0 and auto["shrinkage_source"].startswith("none")
    assert "60 samples" in auto["warning"] and "bias correction" in auto["warning"]
    assert plain["warning"] is not None
    lw = gaussian_mi(x, y, shrinkage="ledoit-wolf")
    assert 0 < lw["shrinkage"] <= 1 and lw["shrinkage_source"] == "ledoit-wolf"
    assert lw["bias_correction"] == 0.0 and "shrinkage" in lw["bias_correction_source"]
    # With fewer samples than dimensions R is singular: auto falls back to Ledoit–Wolf, None fails.
    few_x, few_y = torch.randn(8, 10, generator=g), torch.randn(8, 10, generator=g)
    singular = gaussian_mi(few_x, few_y)
    assert singular["shrinkage"] > 0 and singular["shrinkage_source"].startswith("ledoit-wolf")
    assert "towards 0" in singular["warning"]
    with pytest.raises(ValueError, match="singular"):
        gaussian_mi(few_x, few_y, shrinkage=None)


def test_separable_critic_trained_on_held_out_pairs_gets_close_to_the_true_mi():
    x, y, _ = correlated_gaussians(4000, 2, 1.0)
    result = mutual_information(x.float(), y.float(), method="infonce", critic="separable", steps=250, lr=5e-3,
                                hidden=32, out=16)
    assert result["mi"] == pytest.approx(1.0, rel=0.2)
    assert result["mi"] <= result["ceiling"] == pytest.approx(math.log(128))
    # Three disjoint splits: 1500 fitting + 500 early-stopping pairs, and 2000 held out for the read-out.
    assert result["n_train"] == 2000 and result["n_eval"] == 2000 and result["n_batches"] == 15
    assert result["n_fit"] == result["train"]["n_fit"] == 1500 and result["n_val"] == result["train"]["n_val"] == 500
    assert "disjoint from the fitting and the early-stopping" in result["evaluated_on"]
    assert result["n_unused"] == 2000 - 15 * 128 and result["train"]["bound"] == "infonce"
    assert 0 < result["train"]["best_step"] <= result["train"]["stopped_at"] <= 250


def critic_benchmark(mi, seed=0, n_train=20480, n_eval=8192, dim=20, batch_size=128):
    """Issue #13's benchmark: `train_critic` with its defaults on n_train pairs of dim-d Gaussians with I = mi,
    then the trained, the cosine (τ = 0.1) and the optimal critic read out with InfoNCE on the same disjoint
    batches of n_eval further pairs, which the critic neither fitted nor early-stopped on. Returns the fit and
    a (n_batches, 3) array of per-batch values (trained, cosine, optimal)."""
    x, y, rho = correlated_gaussians(n_train + n_eval, dim, mi, seed)
    fit = train_critic(x[:n_train].float(), y[:n_train].float(), batch_size=batch_size, seed=seed)
    values = []
    with torch.no_grad():
        for start in range(n_train, n_train + n_eval, batch_size):
            xb, yb = x[start : start + batch_size], y[start : start + batch_size]
            values.append([infonce_bound(fit.critic(xb.float(), yb.float()).double()).value,
                           infonce_bound(cosine_critic(xb, yb, temperature=0.1)).value,
                           infonce_bound(optimal_critic(xb, yb, rho)).value])
    return fit, np.array(values)


# Measured (seeds 0, 1, 2; trained / cosine / optimal): I = 2: 1.81-1.86 / 1.80-1.85 / 1.88-1.92, the trained
# critic 0.010-0.018 ± 0.005 above the cosine one on the same batches; I = 4: 3.22-3.26 / 3.04-3.08 / 3.32-3.37.
# Before early stopping, weight decay and the linear path, the trained critic read 1.37-1.40 and 2.52-2.58.
@pytest.mark.parametrize("mi", [2.0, 4.0])
def test_trained_critic_is_near_the_optimal_critic_and_not_below_the_cosine_one(mi):
    fit, values = critic_benchmark(mi)
    (trained, _), (cosine, cosine_se), (optimal, _) = (mean_and_stderr(v) for v in values.T)
    assert trained >= 0.9 * optimal, "within 10% of the InfoNCE of the true log density ratio"
    assert trained >= cosine - cosine_se, "a trained critic must not read below the fixed cosine critic"
    assert trained < optimal <= math.log(128), "no critic beats the optimal one on the same held-out batches"
    protocol = fit.protocol
    assert protocol["n_fit"] == 15360 and protocol["n_val"] == 5120 and protocol["max_steps"] == 1000
    assert protocol["weight_decay"] == 1.0 and protocol["optimizer"] == "adamw"
    curve = dict(protocol["validation_curve"])
    assert protocol["best_validation"] == curve[protocol["best_step"]] == max(curve.values())


def test_early_stopping_stops_an_overfitting_critic_and_keeps_its_best_weights():
    # 1200 fitting pairs in 20 + 20 dimensions: held-out InfoNCE peaks within ~150 steps and then collapses.
    x, y, _ = correlated_gaussians(1600 + 2048, 20, 2.0)
    x, y = x.float(), y.float()
    fit = train_critic(x[:1600], y[:1600], steps=1000)
    assert isinstance(fit, CriticFit)
    protocol, curve = fit.protocol, dict(fit.protocol["validation_curve"])
    assert protocol["n_fit"] == 1200 and protocol["n_val"] == 400
    assert protocol["stopped_early"] and protocol["best_step"] < protocol["stopped_at"] < 1000
    assert protocol["stopped_at"] - protocol["best_step"] == protocol["patience"] * protocol["eval_every"]
    last = curve[protocol["stopped_at"]]
    assert last < protocol["best_validation"] - 0.5, "the setup must overfit for the test to mean anything"
    with torch.no_grad():
        held_out = np.mean([infonce_bound(fit.critic(x[i : i + 128], y[i : i + 128])).value
                            for i in range(1600, len(x), 128)])
    # Had the last weights been kept, new pairs would read near `last`, not near the best validation value.
    assert held_out > protocol["best_validation"] - 0.2 > last


@pytest.mark.parametrize("bound", ["nwj", "dv", "smile"])
def test_train_critic_with_other_bounds_learns_dependence(bound):
    x, y, _ = correlated_gaussians(1000, 2, 1.0, seed=1)
    critic = train_critic(x[:500], y[:500], bound, steps=150, batch_size=64, lr=5e-3, hidden=16, out=8).critic
    with torch.no_grad():
        scores = critic(x[500:628], y[500:628]).double()
    assert 0.5 < dv_bound(scores) < 1.5
    again = train_critic(x[:500], y[:500], bound, steps=150, batch_size=64, lr=5e-3, hidden=16, out=8).critic
    torch.testing.assert_close(again(x[:4], y[:4]), critic(x[:4], y[:4]), msg="same seed, same critic")


def test_mutual_information_with_cosine_critic_reports_its_knobs_and_saturation():
    x, y, _ = correlated_gaussians(512, 8, 20.0)
    result = mutual_information(x, y, method="infonce", critic="cosine", batch_size=64, temperature=0.05)
    assert result["ceiling"] == pytest.approx(math.log(64)) and result["n_train"] == 0
    assert result["n_batches"] == 8 and result["temperature"] == 0.05 and result["train"] is None
    assert result["mi"] <= math.log(64) and "ceiling" in result["warning"]
    smile = mutual_information(x[:, :2], y[:, :2], method="smile", critic="cosine", batch_size=64)
    assert smile["clip"] == 5.0 and "exceed the true MI" in smile["warning"]
    gaussian = mutual_information(x, y, method="gaussian")
    assert gaussian["mi"] > 15 and gaussian["method"] == "gaussian"


def test_label_bound_is_entropy_for_a_perfect_probe_and_zero_for_the_prior():
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3])
    frequencies = torch.bincount(labels).double() / len(labels)
    entropy = float(-(frequencies * frequencies.log()).sum())
    perfect = label_mi_lower_bound(torch.nn.functional.one_hot(labels).double(), labels)
    assert perfect["mi_lower_bound"] == pytest.approx(entropy, abs=1e-9) and perfect["cross_entropy"] == 0
    prior = label_mi_lower_bound(frequencies.expand(len(labels), 4), labels)
    assert prior["mi_lower_bound"] == pytest.approx(0.0, abs=1e-12)
    uniform = label_mi_lower_bound(torch.full((10, 4), 0.25), labels, class_prior=torch.full((4,), 0.25))
    assert uniform["entropy_y"] == pytest.approx(math.log(4)) and uniform["prior"] == "given"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: infonce_bound(torch.zeros(1, 1)), "B ≥ 2"),
        (lambda: nwj_bound(torch.zeros(3, 4)), "square"),
        (lambda: dv_bound(torch.tensor([[0.0, float("nan")], [0.0, 0.0]])), "NaN"),
        (lambda: smile_bound(torch.zeros(2, 2), clip=0), "clip"),
        (lambda: cosine_critic(torch.zeros(3, 2), torch.zeros(3, 5)), "dimension"),
        (lambda: mutual_information(torch.zeros(4, 2), torch.zeros(5, 2)), "pair"),
        (lambda: mutual_information(torch.randn(40, 2), torch.randn(40, 2), method="mine"), "not one of"),
        (lambda: mutual_information(torch.randn(40, 2), torch.randn(40, 2), batch_size=64), "batch_size"),
        (lambda: gaussian_mi(torch.randn(40, 2), torch.randn(40, 2), shrinkage=2.0), "shrinkage"),
        (lambda: label_mi_lower_bound(torch.randn(4, 3), torch.tensor([0, 1, 2, 0])), "softmax"),
        (lambda: SeparableCritic(0, 2), "dim1"),
        (lambda: train_critic(torch.randn(300, 2), torch.randn(300, 2)), "validation pairs"),
        (lambda: train_critic(torch.randn(300, 2), torch.randn(300, 2), validation_fraction=1.0), "early-stopped"),
        (lambda: mutual_information(torch.randn(400, 2), torch.randn(400, 2), critic="separable"), "early-stop on"),
    ],
)
def test_bad_input_fails_with_a_sentence(call, message):
    with pytest.raises(ValueError, match=message):
        call()
