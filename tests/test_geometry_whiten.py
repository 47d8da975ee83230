"""geometry.whiten and geometry.subspace: the constructed whitening head, a known non-whitening head, the
matrix-free estimate against dense float64 computations, and the premise per loss."""

import torch
from torch import nn
from torch.func import hessian

from headprobe.geometry.effective import whitening
from headprobe.geometry.subspace import top_eigenpairs
from headprobe.geometry.whiten import loss_hessian_premise, row_isotropy
from headprobe.train.objectives import info_nce, vicreg

F64 = torch.float64


def _quadratic_case(scales):
    gen = torch.Generator().manual_seed(0)
    d, out, r = 12, 6, 4
    u = torch.linalg.qr(torch.randn(out, out, generator=gen, dtype=F64)).Q
    lam = torch.tensor([3.0, 2.0, 0.5, 0.1], dtype=F64)
    a = u[:, :r] @ torch.diag(lam) @ u[:, :r].T  # rank-r PSD loss Hessian
    rot = torch.linalg.qr(torch.randn(d, r, generator=gen, dtype=F64)).Q.T  # r × d, orthonormal rows
    head = nn.Linear(d, out, bias=False).double()
    with torch.no_grad():
        head.weight.copy_(u[:, :r] @ torch.diag(lam.rsqrt()) @ torch.diag(scales) @ rot)
    z = torch.randn(10, d, generator=gen, dtype=F64)
    return head, (lambda h: 0.5 * torch.einsum("bi,ij,bj->", h, a, h)), z


def test_the_constructed_whitening_head_has_error_zero_and_rank_r():
    head, loss, z = _quadratic_case(torch.ones(4, dtype=F64))
    out = row_isotropy(head, loss, z, 3)
    assert out["rank"] == 4 and out["isotropy_error"] < 1e-10 and out["captured"]


def test_a_non_whitening_head_has_the_known_error():
    s = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64)
    head, loss, z = _quadratic_case(s)
    e = s ** 2  # H_eff = Rᵀ diag(s²) R
    assert abs(row_isotropy(head, loss, z, 3)["isotropy_error"] - float((e - e.mean()).norm() / e.norm())) < 1e-12


def _dense_row_error(head, loss_of_h, z, row):
    """Wᵀ A_i W with A_i = ∂²L/∂h_i² by torch.func (forward-over-reverse), whitening() on it."""
    with torch.no_grad():
        n = len(z) // 2
        h = torch.cat([head(z[:n]), head(z[n:])])
    a = hessian(lambda y: loss_of_h(torch.cat([h[:row], y[None], h[row + 1:]])))(h[row])
    w = head.weight if isinstance(head, nn.Linear) else head[1].weight @ head[0].weight
    values = torch.linalg.eigvalsh((a + a.T) / 2)
    r = int((values.abs() > 1e-9 * values.abs().max()).sum())
    return whitening((w.T @ a @ w).detach(), min(r, z.shape[1]))["isotropy_error"]


def test_matrix_free_equals_dense_on_a_small_coupled_loss_and_at_a_realistic_size():
    torch.manual_seed(0)
    head = nn.Sequential(nn.Linear(20, 8, bias=False), nn.Linear(8, 8, bias=False)).double()
    z = torch.randn(16, 20, dtype=F64)
    loss = lambda h: info_nce(h[:8], h[8:]).loss  # noqa: E731  (couples every sample)
    assert abs(row_isotropy(head, loss, z, 5)["isotropy_error"] - _dense_row_error(head, loss, z, 5)) < 1e-10
    b, d, out = 256, 384, 64
    head = nn.Sequential(nn.Linear(d, out, bias=False), nn.Linear(out, out, bias=False)).double()
    z1 = torch.randn(b, d, dtype=F64)
    z = torch.cat([z1, z1 + 0.1 * torch.randn(b, d, dtype=F64)])
    loss = lambda h: vicreg(h[:b], h[b:], var_weight=0.0, cov_weight=0.0).loss  # noqa: E731
    got = row_isotropy(head, loss, z, 300)
    assert got["rank"] == out and got["captured"]
    assert abs(got["isotropy_error"] - _dense_row_error(head, loss, z, 300)) < 1e-9


def test_the_premise_holds_for_the_invariance_term_and_fails_for_info_nce():
    torch.manual_seed(1)
    h = torch.randn(32, 16, dtype=F64)
    assert loss_hessian_premise(lambda x: vicreg(x[:16], x[16:], var_weight=0.0, cov_weight=0.0).loss, h)["psd"]
    assert loss_hessian_premise(lambda x: info_nce(x[:16], x[16:]).loss, h)["psd"] is False


def test_subspace_iteration_sees_a_multiplicity_and_matches_eigh():
    gen = torch.Generator().manual_seed(2)
    q = torch.linalg.qr(torch.randn(30, 30, generator=gen, dtype=F64)).Q
    values = torch.cat([torch.full((5,), 4.0, dtype=F64), torch.linspace(1.0, 0.01, 25, dtype=F64)])
    a = q @ torch.diag(values) @ q.T
    out = top_eigenpairs(lambda v: v @ a, 30, 5, oversample=8, tol=1e-10, max_iter=200)
    assert out.converged and not out.captured
    assert torch.allclose(out.eigenvalues[:5], torch.full((5,), 4.0, dtype=F64), atol=1e-9)
