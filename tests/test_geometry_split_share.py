"""geometry.split_share: the M-term against its closed form for a two-layer Swish head, the exact share against
the dense effective Hessian, and which heads have M = 0."""

import pytest
import torch
from torch import nn

from headprobe.geometry.effective import effective_hessian
from headprobe.geometry.gm_split import SplitOperators
from headprobe.geometry.split_share import batch_shares, m_share, predicts_zero_m
from headprobe.train.heads import ProjectionHead

pytestmark = pytest.mark.usefixtures("single_thread")
F64 = torch.float64
B, D, W, OUT = 3, 4, 5, 3


def silu_second(x: torch.Tensor) -> torch.Tensor:
    """σ''(x) of x·s(x), s the logistic function: s(1 − s)(2 + x(1 − 2s))."""
    s = torch.sigmoid(x)
    return s * (1 - s) * (2 + x * (1 - 2 * s))


def swish_head() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, W, bias=False), nn.SiLU(), nn.Linear(W, OUT, bias=False)).double()


def target_loss(h: torch.Tensor) -> torch.Tensor:
    t = torch.linspace(-1, 1, h.numel(), dtype=F64).reshape(h.shape)
    return 0.5 * ((h - t) ** 2).sum() + (h[:B] * h[B:]).sum()


def test_m_term_is_the_closed_form_of_a_two_layer_swish_head():
    head = swish_head()
    z = torch.randn(2 * B, D, generator=torch.Generator().manual_seed(1), dtype=F64)
    ops = SplitOperators(head, target_loss, z)
    dense = torch.stack([ops.m_product(e) for e in torch.eye(2 * B * D, dtype=F64)])
    w1, w2 = head[0].weight.detach(), head[2].weight.detach()
    h = ops.h.detach().requires_grad_(True)
    g = torch.autograd.grad(target_loss(h), h)[0]
    blocks = [w1.T @ torch.diag((w2.T @ g[b]) * silu_second(w1 @ z[b])) @ w1 for b in range(2 * B)]
    assert torch.allclose(dense, torch.block_diag(*blocks), rtol=0, atol=1e-13)
    assert dense.abs().max() > 1e-3


def test_exact_share_is_the_dense_m_ratio():
    head = swish_head()
    z1, z2 = torch.randn(2, B, D, generator=torch.Generator().manual_seed(2), dtype=F64)
    exact = m_share(head, target_loss, z1, z2, probes=None)
    dense = effective_hessian(head, torch.cat([z1, z2]), target_loss)["m_ratio"]
    assert exact == pytest.approx(dense, rel=1e-12)
    assert 0 < exact
    # 64 Gaussian probes estimate it (relative error ~ 1/√64 per norm)
    assert m_share(head, target_loss, z1, z2, probes=64) == pytest.approx(exact, rel=0.3)


@pytest.mark.parametrize(("kind", "act", "bn", "mode", "zero"), [
    ("linear", "relu", False, "batch", True),
    ("mlp", "relu", False, "batch", True),
    ("mlp", "relu", True, "running", True),
    ("mlp", "relu", True, "batch", False),
    ("mlp", "swish", False, "running", False),
    ("mlp", "gelu", True, "running", False),
])
def test_m_is_zero_exactly_where_the_head_predicts_it(kind, act, bn, mode, zero):
    torch.manual_seed(3)
    head = ProjectionHead(D, kind=kind, depth=2, width=W, out_dim=OUT, act=act, bn_hidden=bn).double()
    z1, z2 = torch.randn(2, B, D, generator=torch.Generator().manual_seed(4), dtype=F64)
    share = m_share(head, target_loss, z1, z2, probes=4, batchnorm=mode)
    assert predicts_zero_m(head, mode) is zero
    assert (share == 0.0) is zero


def test_batch_shares_use_disjoint_batches_of_the_views():
    head = swish_head()
    views = torch.randn(7, 2, D, generator=torch.Generator().manual_seed(5), dtype=F64)
    shares = batch_shares(head, lambda h1, h2: target_loss(torch.cat([h1, h2])), views, batches=5, batch=B)
    assert len(shares) == 2 and shares[0] != shares[1]
    with pytest.raises(ValueError, match="batches of ≥ 2 images"):
        batch_shares(head, None, views, batches=1, batch=8)
