"""The linear probe read in row blocks (#38): at a block smaller than N, its loss, gradient, whitening and scores
agree with the whole computation, it chooses the same C and makes the same test predictions, and it never asks its
tap for more than a block of rows; at one block it is the whole computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from headprobe.probes import row_blocks
from headprobe.probes.linear import linear_probe
from headprobe.probes.logistic_blocks import loss_and_grad, predict, standardizer, validation_scores
from headprobe.probes.row_blocks import Rows, Whitening
from headprobe.probes.whitening import whiten, whitening_of_rows

BLOCK = 128


class CountingRows:
    """A tap seen only through the row-source interface (len, .shape, .device, .dtype float32, x[slice],
    x[LongTensor] -> float32 blocks), recording the most rows asked for at once."""

    def __init__(self, x: torch.Tensor):
        self.x, self.most = x, 0

    def __len__(self) -> int:
        return len(self.x)

    @property
    def shape(self):
        return self.x.shape

    device = torch.device("cpu")
    dtype = torch.float32

    def __getitem__(self, rows):
        if not isinstance(rows, slice | torch.Tensor):
            raise TypeError(f"rows are read by a slice or an index tensor, not {type(rows).__name__}")
        block = self.x[rows]
        self.most = max(self.most, len(block))
        return block.float()


def problem(n=600, d=20, k=4, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (n,), generator=g)
    mixing = torch.randn(d, d, generator=g, dtype=torch.float64)
    x = (torch.randn(k, d, generator=g, dtype=torch.float64)[y] + torch.randn(n, d, generator=g, dtype=torch.float64))
    return (x @ mixing + 3.0).to(dtype), y


def reference_loss(z, y, Wt, b, C):
    """The objective over the whole matrix, as a formula: mean cross-entropy + ‖W‖² / (2 C N)."""
    logits = (z @ Wt.T + b).double()
    loss = F.cross_entropy(logits, y) + (Wt.double() ** 2).sum() / (2 * C * len(y))
    p = logits.softmax(dim=1) - F.one_hot(y, Wt.shape[0]).double()
    return loss, (p.T @ z.double()) / len(y) + Wt.double() / (C * len(y)), p.mean(dim=0)


def close(a, b, rel):
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float((a - b).abs().max()) <= rel * float(b.abs().max())


@pytest.mark.parametrize("binary", [False, True])
def test_loss_and_gradient_over_blocks_equal_the_whole_matrix(binary):
    x, y = problem(k=2 if binary else 4)
    free = 1 if binary else 4
    g = torch.Generator().manual_seed(1)
    Wt, b = torch.randn(free, 20, generator=g, dtype=torch.float64) * 0.1, torch.randn(free, generator=g).double()
    index = torch.randperm(600, generator=g)[:500].sort().values
    whole = loss_and_grad(Rows.of(x[index], block_rows=500), y[index], Wt, b, 0.3, binary, curvature=True)
    blocks = loss_and_grad(Rows.of(x, block_rows=BLOCK).take(index), y[index], Wt, b, 0.3, binary, curvature=True)
    for one, many in zip(whole, blocks, strict=True):
        assert close(many, one, 1e-12)
    if not binary:  # and the whole computation is the objective's formula
        loss, grad_w, grad_b = reference_loss(x[index], y[index], Wt, b, 0.3)
        assert close(whole[0], loss, 1e-12) and close(whole[1], grad_w, 1e-12) and close(whole[2], grad_b, 1e-12)


def test_folded_whitening_gives_the_loss_of_the_whitened_rows():
    x, y = problem()
    rows = Rows.of(x, block_rows=BLOCK)
    fold, record = whitening_of_rows(rows)
    z = (x - fold.mean) @ fold.projection
    assert torch.allclose(z.T @ z / 600, torch.eye(record["rank"], dtype=torch.float64), atol=1e-10)
    g = torch.Generator().manual_seed(2)
    Wt, b = torch.randn(4, record["rank"], generator=g, dtype=torch.float64), torch.randn(4, generator=g).double()
    whole = loss_and_grad(Rows.of(z, block_rows=600), y, Wt, b, 1.0, False)
    folded = loss_and_grad(rows.whitened(fold), y, Wt, b, 1.0, False)
    for one, many in zip(whole[:3], folded[:3], strict=True):
        assert close(many, one, 1e-10)
    W = Wt.T.contiguous()
    assert validation_scores(rows.whitened(fold), y, W, b)[0] == validation_scores(Rows.of(z), y, W, b)[0]
    assert close(validation_scores(rows.whitened(fold), y, W, b)[1], validation_scores(Rows.of(z), y, W, b)[1], 1e-10)
    assert torch.equal(predict(rows.whitened(fold), W, b)[0], predict(Rows.of(z), W, b)[0])


@pytest.mark.parametrize("shape", [(600, 20), (100, 300)], ids=["covariance", "gram"])
def test_whitening_read_in_blocks_is_whitens(shape):
    """The same whitened geometry (Gram matrix of the whitened rows; a whitening is unique up to a rotation) and
    the same support as `whiten` on the whole matrix, for D ≤ N and D > N."""
    n, d = shape
    g = torch.Generator().manual_seed(3)
    x = problem(n=n, d=d)[0] if d <= n else torch.randn(n, d, dtype=torch.float64, generator=g)
    (z,), record = whiten(x)
    fold, blocked = whitening_of_rows(Rows.of(x, block_rows=32))
    assert blocked["rank"] == record["rank"] and blocked["method"] == record["method"]
    zb = (x - fold.mean) @ fold.projection
    assert close(zb @ zb.T, z @ z.T, 1e-9)


def test_standardizer_over_blocks_equals_torchs_std_mean():
    x = problem(dtype=torch.float32)[0]
    mean, scale = standardizer(Rows.of(x, block_rows=BLOCK), True)
    std, centre = torch.std_mean(x.double(), dim=0, correction=0)
    assert close(mean, centre, 1e-6) and close(scale, std, 1e-6)
    one = standardizer(Rows.of(x, block_rows=600), True)
    assert torch.equal(one[0], torch.std_mean(x, dim=0, correction=0)[1])


def digits():
    from sklearn.datasets import load_digits

    data = load_digits()
    perm = torch.randperm(len(data.target), generator=torch.Generator().manual_seed(0))
    x, y = torch.tensor(data.data, dtype=torch.float32)[perm], torch.tensor(data.target)[perm]
    return x[:1300], y[:1300], x[1300:], y[1300:]


@pytest.mark.parametrize("whitened", [True, False], ids=["whitened", "standardised"])
def test_the_probe_in_blocks_chooses_the_same_C_and_predicts_the_same(whitened):
    train_x, train_y, test_x, test_y = digits()
    grid = [1e-3, 1e-2, 0.1, 1.0, 10.0]
    whole = linear_probe(train_x, train_y, test_x, test_y, C_grid=grid, whiten=whitened, block_rows=1300)
    source = CountingRows(train_x)
    test_source = CountingRows(test_x)
    chunked = linear_probe(source, train_y, test_source, test_y, C_grid=grid, whiten=whitened, block_rows=BLOCK)
    assert 0 < source.most <= BLOCK and 0 < test_source.most <= BLOCK
    assert chunked.metrics == whole.metrics
    assert chunked.protocol["val_accuracy"] == whole.protocol["val_accuracy"]
    assert torch.equal(chunked.predictions, whole.predictions)
    assert float((chunked.probabilities - whole.probabilities).abs().max()) < 1e-3  # fits to tol = 1e-6
    # One block is the whole computation: a row source read as one block, a tensor, the default block size.
    one = linear_probe(CountingRows(train_x), train_y, test_x, test_y, C_grid=grid, whiten=whitened)
    assert row_blocks.WHOLE_ROWS >= 1300 and one.metrics == whole.metrics and one.protocol["block_rows"] is None
    assert torch.equal(one.probabilities, whole.probabilities)
    assert one.protocol["val_log_loss"] == whole.protocol["val_log_loss"]


def test_a_memory_mapped_float16_tap_is_read_in_blocks(tmp_path):
    train_x, train_y, test_x, test_y = digits()
    path = tmp_path / "train.f16"
    stored = np.memmap(path, dtype=np.float16, mode="w+", shape=tuple(train_x.shape))
    stored[:] = train_x.numpy()
    stored.flush()
    mapped = torch.from_numpy(np.memmap(path, dtype=np.float16, mode="r+", shape=tuple(train_x.shape)))
    grid = [1e-2, 0.1, 1.0]
    # Standardised: the whitening's support rule takes float16's eps for float16 rows, and at N = 1,300 rows
    # max(N, D) · eps16 > 1 keeps no direction (on a whole float16 matrix as well).
    chunked = linear_probe(mapped, train_y, test_x, test_y, C_grid=grid, block_rows=BLOCK, whiten=False)
    whole = linear_probe(mapped.float(), train_y, test_x, test_y, C_grid=grid, block_rows=1300, whiten=False)
    assert chunked.metrics == whole.metrics and torch.equal(chunked.predictions, whole.predictions)
    assert chunked.protocol["block_rows"] == BLOCK


def test_grouped_split_and_given_validation_rows_in_blocks():
    train_x, train_y, test_x, test_y = digits()
    groups = torch.arange(1300) // 2
    kwargs = {"C_grid": [0.01, 1.0], "groups": groups}
    assert linear_probe(train_x, train_y, test_x, test_y, block_rows=BLOCK, **kwargs).metrics == linear_probe(
        train_x, train_y, test_x, test_y, **kwargs).metrics
    given = {"C_grid": [0.01, 1.0], "val_features": train_x[1000:], "val_labels": train_y[1000:], "whiten": False}
    one = linear_probe(train_x[:1000], train_y[:1000], test_x, test_y, **given)
    many = linear_probe(train_x[:1000], train_y[:1000], test_x, test_y, block_rows=BLOCK, **given)
    assert many.metrics == one.metrics and torch.equal(many.predictions, one.predictions)


def test_folding_is_only_for_whitening():
    rows = Rows.of(torch.zeros(3, 2))
    assert rows.dim == 2 and rows.whitened(Whitening(torch.zeros(2), torch.zeros(2, 1))).dim == 1


def test_the_default_reads_whole_up_to_whole_rows_and_in_blocks_beyond(monkeypatch):
    """Without block_rows, a tap of at most WHOLE_ROWS rows is read whole (the fast path) and a longer one in blocks
    of BLOCK_ROWS, whatever the two constants are."""
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(300, 8, generator=g), torch.arange(300) % 3
    monkeypatch.setattr(row_blocks, "BLOCK_ROWS", 64)
    monkeypatch.setattr(row_blocks, "WHOLE_ROWS", 400)
    whole_source = CountingRows(x)
    whole = linear_probe(whole_source, y, x[:60], y[:60], C_grid=[1.0])
    assert whole.protocol["block_rows"] is None and whole_source.most == 300
    monkeypatch.setattr(row_blocks, "WHOLE_ROWS", 100)
    blocked_source = CountingRows(x)
    blocked = linear_probe(blocked_source, y, x[:60], y[:60], C_grid=[1.0])
    assert blocked.protocol["block_rows"] == 64 and 0 < blocked_source.most <= 64
    assert torch.equal(whole.predictions, blocked.predictions)
