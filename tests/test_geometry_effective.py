import copy

import pytest
import torch
from torch import nn

from headprobe.geometry import batchnorm_mode, dense_hessian, effective_hessian, head_jacobian, whitening
from headprobe.train.heads import ProjectionHead
from headprobe.train.objectives import simsiam, vicreg

F64 = torch.float64
N = 3  # samples per view; z stacks two views, (2N, D)


pytestmark = pytest.mark.usefixtures("single_thread")


class Swish(nn.Module):
    """x·sigmoid(x) from primitives: nn.SiLU's backward has no forward-mode formula, which dense_hessian needs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


def views(d: int = 5, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(N, d, generator=g, dtype=F64)
    return torch.cat([base + 0.3 * torch.randn(N, d, generator=g, dtype=F64),
                      base + 0.3 * torch.randn(N, d, generator=g, dtype=F64)])


def head(act: str, kind: str = "mlp", bn: bool = False) -> ProjectionHead:
    torch.manual_seed(0)
    h = ProjectionHead(5, kind=kind, depth=2, width=6, out_dim=4, act=act, bn_hidden=bn).to(F64)
    if bn:
        h.train()
        with torch.no_grad():
            h(torch.randn(64, 5, dtype=F64) * 2 + 0.5)
    return h


def vicreg_loss(h: torch.Tensor) -> torch.Tensor:
    return vicreg(h[:N], h[N:]).loss


def oracle(h: nn.Module, z: torch.Tensor, loss_fn, mode: str = "running") -> torch.Tensor:
    """torch.func's forward-over-reverse Hessian of L(h(z)), with Swish spelled out so forward mode works."""
    h = copy.deepcopy(h)
    for layer in h.layers:
        for i, m in enumerate(layer):
            if isinstance(m, nn.SiLU):
                layer[i] = Swish()
    with batchnorm_mode(h, mode):
        return dense_hessian(lambda x: loss_fn(h(x)), z).detach()


CASES = [("linear", "relu", False), ("mlp", "relu", False), ("mlp", "relu", True), ("mlp", "gelu", False),
         ("mlp", "swish", True), ("mlp", "tanh", False)]


@pytest.mark.parametrize("kind,act,bn", CASES)
def test_g_plus_m_is_the_hessian_of_the_loss_through_the_head(kind, act, bn):
    z, h = views(), head(act, kind, bn)
    out = effective_hessian(h, z, vicreg_loss, return_matrices=True)
    m = out["matrices"]
    expected = oracle(h, z, vicreg_loss)
    assert (m["G"] + m["M"] - expected).abs().max() < 1e-10 * max(1.0, float(expected.abs().max()))
    assert out["consistency"] < 1e-12
    torch.testing.assert_close(torch.tensor(out["eigenvalues"], dtype=F64), torch.linalg.eigvalsh(expected),
                               rtol=0, atol=1e-10)
    smooth = act != "relu" and kind == "mlp"
    if smooth:
        assert out["m_ratio"] > 0.05
    else:
        assert out["m_ratio"] < 1e-12  # claim 3: linear and ReLU heads have M = 0 (BN in eval mode is affine)


def test_the_jacobian_is_block_diagonal_per_sample_in_eval_mode_and_coupled_in_batch_mode():
    z, h = views(), head("relu", bn=True)
    running = effective_hessian(h, z, vicreg_loss, return_matrices=True)
    jac = running["matrices"]["J"].reshape(2 * N, 4, 2 * N, 5)
    per_sample = head_jacobian(h, z)
    for i in range(2 * N):
        torch.testing.assert_close(jac[i, :, i], per_sample[i], rtol=0, atol=1e-13)
        jac[i, :, i] = 0
    assert jac.abs().max() == 0
    batch = effective_hessian(h, z, vicreg_loss, batchnorm="batch", return_matrices=True)
    expected = oracle(h, z, vicreg_loss, mode="batch")
    assert (batch["matrices"]["H"] - expected).abs().max() < 1e-10 * float(expected.abs().max())
    # Batch-statistics BatchNorm is a nonlinear function of the batch: a ReLU head gets an M-term there.
    assert batch["m_ratio"] > 0.05 and batch["batchnorm"] == "batch"


def psd_of_rank(r: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """S = U diag(λ) Uᵀ, U: (dim, r) orthonormal, λ spread over two decades."""
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(dim, r, generator=g, dtype=F64))
    lam = torch.logspace(0, 2, r, dtype=F64)
    return u @ torch.diag(lam) @ u.T, u, lam


def test_a_linear_head_can_whiten_a_psd_loss_hessian_and_a_random_one_does_not():
    """Claim 1: with ∇²_h L = I_B ⊗ S, rank S = r, W = U Λ^{-1/2} Vᵀ makes H_eff = I_B ⊗ V Vᵀ: isotropic, scale 1."""
    d, out, r = 5, 4, 3
    s, u, lam = psd_of_rank(r, out, seed=1)
    targets = torch.randn(2 * N, out, generator=torch.Generator().manual_seed(2), dtype=F64)

    def loss(h: torch.Tensor) -> torch.Tensor:
        diff = h - targets
        return 0.5 * torch.einsum("bi,ij,bj->", diff, s, diff)

    v, _ = torch.linalg.qr(torch.randn(d, r, generator=torch.Generator().manual_seed(3), dtype=F64))
    whitener = nn.Linear(d, out, bias=False).to(F64)
    with torch.no_grad():
        whitener.weight.copy_(u @ torch.diag(lam.rsqrt()) @ v.T)
    z = views()
    out_w = effective_hessian(whitener, z, loss, return_matrices=True)
    white = out_w["whitening"]
    assert out_w["loss_hessian_h"]["rank"] == 2 * N * r and out_w["loss_hessian_h"]["psd"]
    assert white["rank"] == 2 * N * r
    assert white["spread"] == pytest.approx(1.0, abs=1e-10)
    assert white["scale"] == pytest.approx(1.0, abs=1e-10)
    assert white["isotropy_error"] < 1e-10 and white["outside"] < 1e-10
    # vᵀ H_eff v = |v|² on the whitened subspace (span of V in every sample).
    direction = torch.zeros(2 * N, d, dtype=F64)
    direction[1] = v @ torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    flat = direction.reshape(-1)
    assert float(flat @ out_w["matrices"]["H"] @ flat) == pytest.approx(float(flat @ flat), rel=1e-10)
    torch.manual_seed(4)
    random = effective_hessian(nn.Linear(d, out, bias=False).to(F64), z, loss)["whitening"]
    assert random["spread"] > 10 and random["isotropy_error"] > 0.3


def test_whitening_summary_on_known_spectra():
    out = whitening(torch.diag(torch.tensor([4.0, -2.0, 1.0, 0.0], dtype=F64)), 3)
    assert out["eigenvalues"] == [4.0, -2.0, 1.0]
    assert out["spread"] == 4.0 and out["n_negative"] == 1 and out["outside"] == 0.0
    assert whitening(torch.diag(torch.tensor([1.0, 0.0], dtype=F64)), 2)["spread"] == float("inf")
    with pytest.raises(ValueError, match="1..2"):
        whitening(torch.eye(2, dtype=F64), 3)


def test_simsiam_loss_hessian_in_the_output_is_indefinite():
    """The paper's caveat: the negative cosine has an indefinite ∇²_h L, so claim 1's PSD premise fails -- measured."""
    torch.manual_seed(0)
    predictor = nn.Linear(4, 4).to(F64)
    out = effective_hessian(head("gelu"), views(),
                            lambda h: simsiam(predictor(h[:N]), predictor(h[N:]), h[:N], h[N:]))
    hh = out["loss_hessian_h"]
    assert not hh["psd"] and hh["lambda_min"] < -1e-3 < 1e-3 < hh["lambda_max"]


def test_effective_hessian_checks_its_arguments():
    z, h = views(), head("gelu")
    with pytest.raises(ValueError, match="scalar"):
        effective_hessian(h, z, lambda out: out.sum(0))
    with pytest.raises(ValueError, match="batchnorm mode"):
        effective_hessian(h, z, vicreg_loss, batchnorm="train")
    with pytest.raises(ValueError, match="rtol"):
        effective_hessian(h, z, vicreg_loss, rtol=2.0)
