import pathlib

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from sklearn_whitening import Whitener

from headprobe.probes import fit_logistic, linear_probe

SMALL_GRID = (1e-3, 1e-1, 10.0, 1e3)


pytestmark = pytest.mark.usefixtures("single_thread")


def make_data(n, dim=6, num_classes=3, spread=1.0, seed=0):
    """Gaussian blobs, float64; labels are balanced so every class survives a stratified split.

    The blob centres depend only on (dim, num_classes), so calls with different seeds draw train and
    test sets from one distribution.
    """
    centers = np.random.default_rng([dim, num_classes]).normal(size=(num_classes, dim)) * 2
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % num_classes
    rng.shuffle(labels)
    return centers[labels] + spread * rng.normal(size=(n, dim)), labels


def tensors(*arrays, dtype=torch.float64):
    """numpy -> torch; float arrays become `dtype`, integer labels stay int64."""
    return [torch.from_numpy(a).to(dtype) if a.dtype.kind == "f" else torch.from_numpy(a) for a in arrays]


def relative_error(ours, theirs):
    return np.abs(ours - theirs).max() / np.abs(theirs).max()


@pytest.mark.parametrize("num_classes", [3, 2])
@pytest.mark.parametrize("C", [0.05, 20.0])
def test_fit_logistic_matches_sklearn(num_classes, C):
    x, y = make_data(120, dim=5, num_classes=num_classes, spread=2.0)
    reference = LogisticRegression(C=C, solver="lbfgs", tol=1e-10, max_iter=10000).fit(x, y)
    W, b = fit_logistic(torch.from_numpy(x), torch.from_numpy(y), C, num_classes, tol=1e-10, max_iter=10000)
    assert W.dtype == torch.float64 and W.shape == (5, num_classes) and b.shape == (num_classes,)
    W, b = W.numpy(), b.numpy()
    # sklearn fits a single binomial weight vector for two classes; it corresponds to our class-1 column.
    coef, intercept = (W[:, 1:].T, b[1:]) if num_classes == 2 else (W.T, b)
    assert relative_error(coef, reference.coef_) < 1e-3
    assert relative_error(intercept, reference.intercept_) < 1e-3
    probabilities = torch.softmax(torch.from_numpy(x @ W + b), dim=1).numpy()
    np.testing.assert_allclose(probabilities, reference.predict_proba(x), atol=1e-6)


@pytest.mark.parametrize("num_classes", [3, 2])
def test_warm_start_reaches_the_same_optimum(num_classes):
    x, y = make_data(90, num_classes=num_classes, spread=2.0, seed=1)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    cold = fit_logistic(x, y, 1.0, num_classes, tol=1e-10)
    warm = fit_logistic(x, y, 1.0, num_classes, tol=1e-10, init=fit_logistic(x, y, 0.01, num_classes))
    for ours, reference in zip(warm, cold, strict=True):
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("num_classes", [3, 2])
def test_init_at_an_equivalent_optimum_is_returned_in_canonical_form(num_classes):
    x, y = make_data(90, num_classes=num_classes, spread=2.0, seed=1)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    W, b = fit_logistic(x, y, 1.0, num_classes, tol=1e-10)
    # Shifting every intercept (and, for the binomial, every column) leaves the softmax unchanged, so
    # the solver starts at the optimum and only the canonical form has to be restored.
    shift = torch.linspace(-1, 1, W.shape[0])[:, None] if num_classes == 2 else 0.0
    again = fit_logistic(x, y, 1.0, num_classes, tol=1e-6, max_iter=1, init=(W + shift, b + 3.0))
    for ours, reference in zip(again, (W, b), strict=True):
        torch.testing.assert_close(ours, reference, rtol=0, atol=1e-6)


def test_fit_logistic_computes_in_float32_for_non_double_input():
    x, y = make_data(60)
    W, b = fit_logistic(torch.from_numpy(x).half(), torch.from_numpy(y), 1.0, 3)
    assert W.dtype == b.dtype == torch.float32


def test_fit_logistic_rejects_a_class_without_samples():
    x, y = make_data(30)
    with pytest.raises(ValueError, match=r"classes \[3\] have no samples"):
        fit_logistic(torch.from_numpy(x), torch.from_numpy(y), 1.0, 4)


@pytest.mark.parametrize("whiten", [True, False])
def test_linear_probe_follows_the_protocol_of_a_plain_sklearn_pipeline(whiten):
    x, y = make_data(150, spread=2.5, seed=2)
    x_test, y_test = make_data(60, spread=2.5, seed=3)
    result = linear_probe(*tensors(x, y, x_test, y_test), C_grid=SMALL_GRID, seed=7, tol=1e-10, whiten=whiten)

    fit_idx, val_idx = train_test_split(np.arange(len(y)), test_size=0.2, stratify=y, random_state=7)
    # Whitened: one whitening of all of train, before the split; standardised: on the fitting part, then on all.
    scaler = Whitener(x) if whiten else StandardScaler().fit(x[fit_idx])
    fits = [LogisticRegression(C=C, tol=1e-10, max_iter=10000).fit(scaler.transform(x[fit_idx]), y[fit_idx])
            for C in SMALL_GRID]
    val_accuracy = [fit.score(scaler.transform(x[val_idx]), y[val_idx]) for fit in fits]
    val_log_loss = [log_loss(y[val_idx], fit.predict_proba(scaler.transform(x[val_idx]))) for fit in fits]
    chosen_C = SMALL_GRID[int(np.argmax(val_accuracy))]
    scaler = Whitener(x) if whiten else StandardScaler().fit(x)
    final = LogisticRegression(C=chosen_C, tol=1e-10, max_iter=10000).fit(scaler.transform(x), y)
    probabilities = final.predict_proba(scaler.transform(x_test))

    assert result.protocol["val_accuracy"] == pytest.approx(val_accuracy)
    assert result.protocol["val_log_loss"] == pytest.approx(val_log_loss, rel=1e-5)
    assert result.metrics["linear.C"] == result.protocol["chosen_C"] == chosen_C
    assert result.metrics["linear.val_acc"] == pytest.approx(max(val_accuracy))
    np.testing.assert_allclose(result.probabilities.numpy(), probabilities, atol=1e-5)
    assert torch.equal(result.predictions, torch.from_numpy(probabilities.argmax(axis=1)))
    assert result.metrics["linear.acc"] == pytest.approx(final.score(scaler.transform(x_test), y_test))
    assert (result.protocol["n_train"], result.protocol["n_fit"], result.protocol["n_val"]) == (150, 120, 30)


def test_test_labels_never_influence_the_choice_of_C():
    x, y, x_test, y_test = tensors(*make_data(150, spread=3.0, seed=4), *make_data(90, spread=3.0, seed=5))
    honest = linear_probe(x, y, x_test, y_test)
    permutation = torch.randperm(len(y_test), generator=torch.Generator().manual_seed(0))
    shuffled = linear_probe(x, y, x_test, y_test[permutation])
    assert shuffled.protocol["chosen_C"] == honest.protocol["chosen_C"]
    assert shuffled.protocol["val_accuracy"] == honest.protocol["val_accuracy"]
    assert torch.equal(shuffled.probabilities, honest.probabilities)
    assert shuffled.metrics["linear.acc"] < honest.metrics["linear.acc"]


def test_separable_data_is_classified_perfectly_and_ties_pick_the_smallest_C():
    train, test = make_data(120, spread=0.05, seed=6), make_data(60, spread=0.05, seed=7)
    result = linear_probe(*tensors(*train, *test, dtype=torch.float32))
    assert result.metrics["linear.acc"] == 1.0
    assert result.protocol["val_accuracy"] == [1.0] * 8
    assert result.metrics["linear.C"] == 1e-4
    assert result.probabilities.dtype == torch.float32 and result.probabilities.shape == (60, 3)
    torch.testing.assert_close(result.probabilities.sum(dim=1), torch.ones(60))


def test_same_seed_gives_identical_results():
    x, y = tensors(*make_data(90, spread=3.0, seed=7), dtype=torch.float32)
    first, second = (linear_probe(x, y, x, y, C_grid=SMALL_GRID, seed=3) for _ in range(2))
    assert torch.equal(first.probabilities, second.probabilities)
    assert first.protocol == second.protocol and first.metrics == second.metrics


@pytest.mark.parametrize("whiten", [True, False])
def test_explicit_validation_set_is_used_and_never_trained_on(whiten):
    x, y = make_data(90, spread=3.0, seed=8)
    x_val, y_val = tensors(*make_data(30, spread=3.0, seed=9))
    result = linear_probe(*tensors(x, y, x, y), val_features=x_val, val_labels=y_val, C_grid=[0.1], tol=1e-9,
                          whiten=whiten)
    x = (Whitener(x) if whiten else StandardScaler().fit(x)).transform(x)
    reference = LogisticRegression(C=0.1, tol=1e-10, max_iter=10000).fit(x, y)
    np.testing.assert_allclose(result.probabilities.numpy(), reference.predict_proba(x), atol=1e-5)
    assert result.protocol["val_source"] == "given" and result.protocol["n_val"] == 30


def _bad_inputs():
    x, y = torch.randn(30, 4), torch.arange(30) % 3
    return [
        (dict(train_labels=torch.cat([y[:-1], torch.tensor([3])])), r"classes \[3\] have fewer than 2"),
        (dict(test_labels=torch.full((30,), 5)), "never occurs in training"),
        (dict(train_labels=y * 2), r"classes \[1, 3\] have no training samples"),
        (dict(train_labels=torch.zeros(30, dtype=torch.int64)), "single class"),
        (dict(val_features=x), "together"),
        (dict(val_features=torch.randn(30, 5), val_labels=y), "val_features has 5"),
        (dict(C_grid=(0.0, 1.0)), "C_grid must be"),
        (dict(C_grid=()), "C_grid must be"),
        (dict(val_fraction=1.0), "val_fraction must lie"),
        (dict(val_fraction=0.05), "stratified validation split failed"),
        (dict(test_features=torch.randn(30, 4, 2)), "must be 2-D"),
    ]


@pytest.mark.parametrize("override, message", _bad_inputs())
def test_linear_probe_rejects_bad_inputs_with_a_sentence(override, message):
    x, y = torch.randn(30, 4), torch.arange(30) % 3
    kwargs = dict(train_features=x, train_labels=y, test_features=x, test_labels=y) | override
    with pytest.raises(ValueError, match=message):
        linear_probe(**kwargs)


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize(("n", "d"), [(50, 7), (2000, 700)])  # one row block; several, the last one partial
def test_hand_written_gradient_equals_autograd_of_the_objective(binary, n, d):
    from headprobe.probes.logistic_blocks import loss_and_grad
    from headprobe.probes.row_blocks import Rows

    g = torch.Generator().manual_seed(3)
    k, C = 2 if binary else 4, 0.3
    x, y = torch.randn(n, d, generator=g, dtype=torch.float64), torch.randint(k, (n,), generator=g)
    free = 1 if binary else k
    Wt = torch.randn(free, d, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(free, generator=g, dtype=torch.float64, requires_grad=True)
    logits = x @ Wt.T + b
    if binary:
        logits = torch.cat([torch.zeros_like(logits), logits], dim=1)
    expected = torch.nn.functional.cross_entropy(logits, y) + Wt.pow(2).sum() / (2 * C * n)
    expected.backward()
    loss, grad_w, grad_b, A = loss_and_grad(Rows.of(x), y, Wt.detach(), b.detach(), C, binary,
                                             curvature=True)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-14)
    torch.testing.assert_close(grad_w, Wt.grad, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad_b, b.grad, rtol=1e-12, atol=1e-14)

    # A is the Hessian of the mean cross-entropy in a logit offset shared by every sample (free classes only).
    def mean_ce(offset):
        shifted = logits.detach() + (torch.cat([torch.zeros(1, dtype=offset.dtype), offset]) if binary else offset)
        return torch.nn.functional.cross_entropy(shifted, y)

    hessian = torch.autograd.functional.hessian(mean_ce, torch.zeros(free, dtype=torch.float64))
    torch.testing.assert_close(A, hessian, rtol=1e-10, atol=1e-14)
    assert loss_and_grad(Rows.of(x), y, Wt.detach(), b.detach(), C, binary)[3] is None


def test_float32_fits_reach_the_gradient_tolerance():
    # With the loss summed in float32 the line search stalled at max |grad| ~1e-5 on this problem.
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(10, 256, generator=g)
    y = torch.randint(10, (3000,), generator=g)
    x = 0.15 * centres[y] + torch.randn(3000, 256, generator=g)
    x = (x - x.mean(0)) / x.std(0)
    for C in (1e-4, 1e-2, 1.0):
        W, b = fit_logistic(x, y, C, 10, tol=1e-6)
        Wt, bb = W.T.contiguous(), b.clone().requires_grad_(True)
        Wt.requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(x.double() @ Wt.double().T + bb.double(), y) + Wt.double().pow(
            2).sum() / (2 * C * len(y))
        loss.backward()
        assert max(Wt.grad.abs().max().item(), bb.grad.abs().max().item()) <= 2e-6, C


def test_path_start_extends_the_secant_in_log_C():
    from headprobe.probes.linear import _path_start

    W0, b0, W1, b1 = torch.zeros(3, 2), torch.zeros(2), torch.ones(3, 2), torch.full((2,), 2.0)
    assert _path_start([], [0.1]) is None
    assert _path_start([(W0, b0)], [0.1, 1.0])[0] is W0
    W, b = _path_start([(W0, b0), (W1, b1)], [0.1, 1.0, 100.0])  # the last step is twice as long in log C
    torch.testing.assert_close(W, torch.full((3, 2), 3.0))
    torch.testing.assert_close(b, torch.full((2,), 6.0))


def _small_problem(binary=False, n=200, d=12, seed=5):
    g = torch.Generator().manual_seed(seed)
    k = 2 if binary else 4
    y = torch.arange(n) % k
    centres = torch.randn(k, d, generator=g, dtype=torch.float64)
    x = centres[y] + 1.5 * torch.randn(n, d, generator=g, dtype=torch.float64)
    return x, y, k


def test_lbfgs_without_preconditioner_retraces_torch_lbfgs():
    from headprobe.probes.lbfgs import minimize
    from headprobe.probes.logistic_blocks import loss_and_grad
    from headprobe.probes.row_blocks import Rows

    x, y, k = _small_problem()
    n, d = x.shape
    C = 2.0

    def evaluate(theta):
        loss, grad_w, grad_b, _ = loss_and_grad(Rows.of(x), y, theta[: k * d].view(k, d), theta[k * d :], C, False)
        return float(loss), torch.cat([grad_w.flatten(), grad_b])

    theta0 = torch.zeros(k * d + k, dtype=torch.float64)
    theta, grad, pairs, evaluations, iterations, stop = minimize(
        evaluate, theta0, *evaluate(theta0), tol=1e-6, max_iter=500, precondition=lambda v: v.clone(), memory=7
    )
    reference = theta0.clone().requires_grad_(False)
    calls = []

    def closure():
        calls.append(1)
        loss, reference.grad = evaluate(reference)
        return torch.tensor(loss, dtype=torch.float64)

    optimizer = torch.optim.LBFGS([reference], lr=1.0, max_iter=500, tolerance_grad=1e-6, tolerance_change=0.0,
                                  history_size=7, line_search_fn="strong_wolfe")
    optimizer.step(closure)
    assert stop == "tolerance" and grad.abs().max() <= 1e-6 and len(pairs) == 7
    assert (evaluations, iterations) == (len(calls), optimizer.state[reference]["n_iter"])
    torch.testing.assert_close(theta, reference, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("binary", [False, True])
def test_shifted_curvature_pairs_equal_pairs_taken_at_the_new_C(binary):
    from headprobe.probes.logistic import shift_curvature_pairs
    from headprobe.probes.logistic_blocks import loss_and_grad
    from headprobe.probes.row_blocks import Rows

    x, y, k = _small_problem(binary)
    n, d = x.shape
    free = 1 if binary else k
    g = torch.Generator().manual_seed(1)
    points = [torch.randn(free * d + free, generator=g, dtype=torch.float64) for _ in range(3)]

    def gradient(theta, C):
        _, grad_w, grad_b, _ = loss_and_grad(Rows.of(x), y, theta[: free * d].view(free, d),
                                              theta[free * d :], C, binary)
        return torch.cat([grad_w.flatten(), grad_b])

    def pairs(C):
        return [(b - a, gradient(b, C) - gradient(a, C)) for a, b in zip(points[:-1], points[1:], strict=True)]

    shifted = shift_curvature_pairs(pairs(0.01), 0.01, 3.0, n, free * d)
    assert len(shifted) == 2
    for (s, y_shifted), (s_ref, y_ref) in zip(shifted, pairs(3.0), strict=True):
        torch.testing.assert_close(s, s_ref)
        torch.testing.assert_close(y_shifted, y_ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("low_rank", [False, True])
@pytest.mark.parametrize("free", [1, 4])
def test_class_preconditioner_inverts_its_kronecker_model(free, low_rank):
    from headprobe.probes.logistic import FeatureMoments, _class_preconditioner

    g = torch.Generator().manual_seed(2)
    d, penalty = 5, 0.03
    p = torch.softmax(torch.randn(50, 2 if free == 1 else free, generator=g, dtype=torch.float64), dim=1)
    p = p[:, 1:] if free == 1 else p  # the binomial's one free class
    A = torch.diag(p.mean(0)) - p.T @ p / 50
    if low_rank:  # two eigen-directions kept, the other three at one bulk level
        V = torch.linalg.qr(torch.randn(d, 2, generator=g, dtype=torch.float64))[0]
        moments = FeatureMoments(torch.tensor([3.0, 0.2], dtype=torch.float64), V, 0.7)
        M = V @ torch.diag(moments.values) @ V.T + 0.7 * (torch.eye(d, dtype=torch.float64) - V @ V.T)
    else:
        moments = FeatureMoments(torch.rand(d, generator=g, dtype=torch.float64) + 0.5)
        M = torch.diag(moments.values)
    P = _class_preconditioner(A, moments, penalty)(torch.eye(free * d + free, dtype=torch.float64))
    # Rows are (class, feature) weight entries in (F, D) order, then the F intercepts.
    weight_model = torch.kron(A, M) + penalty * torch.eye(free * d, dtype=torch.float64)
    intercept_model = A + (A.trace() / free**2 * torch.ones(free, free, dtype=torch.float64) if free > 1 else 0)
    torch.testing.assert_close(P[: free * d, : free * d] @ weight_model, torch.eye(free * d, dtype=torch.float64))
    torch.testing.assert_close(P[free * d :, free * d :] @ intercept_model, torch.eye(free, dtype=torch.float64))
    assert P[: free * d, free * d :].abs().max() == 0 and P[free * d :, : free * d].abs().max() == 0
    torch.testing.assert_close(P, P.T)


def test_feature_moments_keep_real_directions_and_flatten_sampling_noise():
    from headprobe.probes.logistic import feature_moments

    g = torch.Generator().manual_seed(4)
    isotropic = torch.randn(3000, 64, generator=g)
    flat = feature_moments(isotropic)
    assert flat.basis.shape[1] <= 2 and flat.bulk == pytest.approx(1.0, rel=0.05)
    spike = torch.linalg.qr(torch.randn(64, 3, generator=g))[0]  # three directions with 25x the variance
    spiked = isotropic + 4.9 * torch.randn(3000, 3, generator=g) @ spike.T
    moments = feature_moments(spiked)
    kept = moments.basis[:, moments.values > 10]
    assert kept.shape[1] == 3
    # The kept directions span the spike: projecting the spike onto them loses almost nothing.
    assert torch.linalg.matrix_norm(spike - kept @ (kept.T @ spike)) < 0.1
    assert feature_moments(spiked, max_dim=32).basis is None  # above max_dim: the diagonal only


@pytest.mark.parametrize("num_classes", [3, 2])
def test_every_fit_of_the_path_is_recorded_and_meets_the_tolerance(num_classes):
    x, y = make_data(300, dim=10, num_classes=num_classes, spread=2.0, seed=11)
    x_test, y_test = make_data(60, dim=10, num_classes=num_classes, spread=2.0, seed=12)
    result = linear_probe(*tensors(x, y, x_test, y_test, dtype=torch.float32), C_grid=SMALL_GRID, tol=1e-6)
    fits = result.protocol["fits"]
    assert [f["C"] for f in fits] == [*SMALL_GRID, result.metrics["linear.C"]]
    assert [f.get("refit", False) for f in fits] == [False] * len(SMALL_GRID) + [True]
    for fit in fits:
        assert fit["stop"] == "tolerance" and fit["grad_max"] <= 1e-6, fit
        assert fit["evaluations"] >= fit["iterations"] + 1


def test_a_stalled_float32_fit_is_finished_in_float64_and_meets_the_tolerance():
    from headprobe.probes.logistic import fit_free_parameters, free_parameters

    x, y = make_data(300, dim=10, num_classes=3, spread=2.0, seed=11)
    x, y = torch.from_numpy(x).float(), torch.from_numpy(y)
    x = (x - x.mean(0)) / x.std(0, correction=0)
    for C in (0.1, 1e3):
        W, b = fit_logistic(x, y, C, 3, tol=1e-6)
        assert W.dtype == torch.float32
        Wt, bb = W.T.double().requires_grad_(True), b.double().requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(x.double() @ Wt.T + bb, y) + Wt.pow(2).sum() / (2 * C * len(y))
        loss.backward()
        # Measured in float64 at the returned float32 parameters; torch's LBFGS stopped at 2.0e-6 and 1.9e-6.
        assert max(Wt.grad.abs().max().item(), bb.grad.abs().max().item()) <= 1e-6, C
    # At C = 1000 the float32 line search runs out of resolution; the float64 finish is what meets the test.
    *_, fit = fit_free_parameters(x, y, 1e3, *free_parameters(None, x, 3), False, max_iter=1000, tol=1e-6)
    assert fit.float64_finish and fit.stop == "tolerance" and fit.grad_max <= 1e-6


@pytest.mark.parametrize("binary", [False, True])
def test_refit_pairs_are_exact_when_only_the_standardisation_changes(binary):
    from headprobe.probes.logistic import refit_curvature_pairs
    from headprobe.probes.logistic_blocks import loss_and_grad
    from headprobe.probes.row_blocks import Rows

    raw, y, k = _small_problem(binary)
    n, d = raw.shape
    free, C = 1 if binary else k, 0.7
    mean_a, scale_a = raw.mean(0), raw.std(0)
    mean_b, scale_b = raw[: n // 2].mean(0), raw[: n // 2].std(0)  # another standardisation of the same rows
    ratio, shift = scale_b / scale_a, (mean_b - mean_a) / scale_a

    def gradient(theta, mean, scale):
        x = (raw - mean) / scale
        _, grad_w, grad_b, _ = loss_and_grad(Rows.of(x), y, theta[: free * d].view(free, d), theta[free * d :], C,
                                              binary)
        return torch.cat([grad_w.flatten(), grad_b])

    def to_b(theta):  # the same logits in standardisation b
        Wt, bias = theta[: free * d].view(free, d), theta[free * d :]
        return torch.cat([(Wt * ratio).flatten(), bias + Wt @ shift])

    g = torch.Generator().manual_seed(6)
    points = [0.3 * torch.randn(free * d + free, generator=g, dtype=torch.float64) for _ in range(3)]
    pairs = [(q - p, gradient(q, mean_a, scale_a) - gradient(p, mean_a, scale_a))
             for p, q in zip(points[:-1], points[1:], strict=True)]
    expected = [(to_b(q) - to_b(p), gradient(to_b(q), mean_b, scale_b) - gradient(to_b(p), mean_b, scale_b))
                for p, q in zip(points[:-1], points[1:], strict=True)]
    mapped = refit_curvature_pairs(pairs, ratio, shift, C, n, n)
    assert len(mapped) == 2
    for (s, y_), (s_ref, y_ref) in zip(mapped, expected, strict=True):
        torch.testing.assert_close(s, s_ref, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(y_, y_ref, rtol=1e-10, atol=1e-13)


def test_linear_probe_takes_numpy_arrays_and_leaves_them_unchanged():
    x, y = make_data(200, seed=3)
    x_test, y_test = make_data(60, seed=4)
    before = x.copy()
    from_numpy = linear_probe(x, y, x_test, y_test, C_grid=SMALL_GRID)
    from_torch = linear_probe(*tensors(x, y, x_test, y_test), C_grid=SMALL_GRID)
    assert from_numpy.metrics == from_torch.metrics
    assert torch.equal(from_numpy.predictions, from_torch.predictions)
    np.testing.assert_array_equal(x, before)


def test_grouped_validation_split_never_puts_one_group_on_both_sides():
    from headprobe.probes.linear import grouped_validation_split

    groups = torch.arange(200) % 50  # 50 images, 4 rows each
    fit_idx, val_idx = grouped_validation_split(groups, 0.2, seed=3)
    fit_groups, val_groups = set(groups[fit_idx].tolist()), set(groups[val_idx].tolist())
    assert not fit_groups & val_groups and fit_groups | val_groups == set(range(50))
    assert len(val_groups) == 10 and len(val_idx) == 40 and sorted(np.r_[fit_idx, val_idx]) == list(range(200))
    assert np.array_equal(grouped_validation_split(groups, 0.2, seed=3)[1], val_idx)  # same seed, same split
    with pytest.raises(ValueError, match="at least 2 groups"):
        grouped_validation_split(torch.zeros(8), 0.2, seed=0)


@pytest.mark.parametrize("whiten", [True, False])
def test_linear_probe_with_groups_chooses_C_on_the_grouped_split(whiten):
    from headprobe.probes.linear import grouped_validation_split

    x, y = make_data(160, spread=2.5, seed=4)
    x_test, y_test = make_data(60, spread=2.5, seed=5)
    groups = np.arange(160) % 40
    result = linear_probe(*tensors(x, y, x_test, y_test), C_grid=SMALL_GRID, seed=7, tol=1e-10,
                          groups=torch.from_numpy(groups), whiten=whiten)
    fit_idx, val_idx = grouped_validation_split(torch.from_numpy(groups), 0.2, seed=7)
    scaler = Whitener(x) if whiten else StandardScaler().fit(x[fit_idx])
    val_accuracy = [LogisticRegression(C=C, tol=1e-10, max_iter=10000).fit(scaler.transform(x[fit_idx]), y[fit_idx])
                    .score(scaler.transform(x[val_idx]), y[val_idx]) for C in SMALL_GRID]
    assert result.protocol["val_accuracy"] == pytest.approx(val_accuracy)
    assert result.protocol["chosen_C"] == SMALL_GRID[int(np.argmax(val_accuracy))]
    assert result.protocol["n_val"] == 32 and result.protocol["val_split"].startswith("grouped")
    # The stratified split of the same rows is a different one: the groups really decided it.
    ungrouped = linear_probe(*tensors(x, y, x_test, y_test), C_grid=SMALL_GRID, seed=7, tol=1e-10)
    assert ungrouped.protocol["val_split"] == "stratified by class"
    with pytest.raises(ValueError, match="one group"):
        linear_probe(*tensors(x, y, x_test, y_test), groups=torch.zeros(5))


def _tap(seed=12):
    from headprobe.probes.tap_data import TapData

    x, y = make_data(240, dim=10, num_classes=3, spread=2.0, seed=seed)
    q, yq = make_data(90, dim=10, num_classes=3, spread=2.0, seed=seed + 1)
    x, q = (torch.from_numpy(a * np.logspace(-1, 1, 10)).float() for a in (x, q))
    return TapData("backbone", x, torch.from_numpy(y), q, torch.from_numpy(yq), 3, seed=0)


def test_the_linear_probe_reports_the_whitened_primary_the_standardised_description_and_their_per_image_values():
    from headprobe.probes.builtin.linear import LINEAR
    from headprobe.probes.label_mi import label_mi_lower_bound

    tap = _tap()
    out = LINEAR(tap, C_grid=SMALL_GRID)
    split = dict(C_grid=SMALL_GRID, val_fraction=tap.val_fraction, seed=tap.seed)
    whitened = linear_probe(tap.train_x, tap.train_y, tap.test_x, tap.test_y, **split)
    standardised = linear_probe(tap.train_x, tap.train_y, tap.test_x, tap.test_y, whiten=False, **split)
    assert out.metrics["linear.acc"] == whitened.metrics["linear.acc"]
    assert out.metrics["linear.standardized.acc"] == standardised.metrics["linear.acc"]
    assert out.metrics["linear.standardized.C"] == standardised.metrics["linear.C"]
    y = tap.test_y.long()
    assert torch.equal(out.per_unit["linear.acc"].values, (whitened.predictions == y).double())
    assert torch.equal(out.per_unit["linear.standardized.acc"].values, (standardised.predictions == y).double())
    assert out.protocol["whiten"]["rank"] == 10 and out.protocol["standardized"]["whiten"] is None
    # mi.label: the whitened probe refitted at the C of the best validation log-likelihood.
    bound_C = SMALL_GRID[int(np.argmin(whitened.protocol["val_log_loss"]))]
    calibrated = linear_probe(tap.train_x, tap.train_y, tap.test_x, tap.test_y, **(split | {"C_grid": [bound_C]}))
    assert out.protocol["mi.label"]["C"] == bound_C
    assert out.metrics["mi.label"] == pytest.approx(label_mi_lower_bound(calibrated.probabilities,
                                                                         tap.test_y)["mi_lower_bound"])
    assert out.per_unit["mi.label"].value() == pytest.approx(out.metrics["mi.label"])
    alone = LINEAR(tap, C_grid=SMALL_GRID, standardized_probe=False)
    assert not any(name.startswith("linear.standardized") for name in alone.metrics | alone.per_unit)
    assert "standardized" not in alone.protocol and alone.metrics["linear.acc"] == out.metrics["linear.acc"]


def test_features_with_dead_units_give_a_finite_probe():
    """Mean-pooled features of the tiny VICReg ResNet (tests/fixtures/upstream, 64 digits at 32 px): 110 of 256
    units never fire. float32 eigh of their second moments returned NaN eigenvalues without raising, the
    preconditioner became NaN, and the standardised probe failed at C = 0.001 with "eigh failed to converge"."""
    from headprobe.probes.logistic import feature_moments

    data = np.load(pathlib.Path(__file__).parent / "fixtures" / "features" / "vicreg_tiny_dead_units.npz")
    train_x, train_y, test_x, test_y = (torch.from_numpy(data[k]) for k in ("train_x", "train_y", "test_x", "test_y"))
    assert (train_x.std(0) == 0).sum() == 110
    moments = feature_moments(train_x)
    assert torch.isfinite(moments.values).all() and (moments.basis is None or torch.isfinite(moments.basis).all())
    for whiten in (False, True):
        result = linear_probe(train_x, train_y, test_x, test_y, whiten=whiten, standardize=True, seed=0)
        assert torch.isfinite(result.probabilities).all()
    # Standardised, above chance (10 classes, 32 test images); whitened, 64 rows in 146 live dimensions are
    # equidistant (see linear_probe), so only finiteness is asked of it.
    assert linear_probe(train_x, train_y, test_x, test_y, whiten=False, seed=0).metrics["linear.acc"] > 0.2
