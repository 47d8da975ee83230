import pytest
import torch
from torch import nn

from headprobe.geometry import augmentation_degeneracy, batchnorm_mode, head_jacobian, pullback_metric
from headprobe.train.heads import ProjectionHead
from headprobe.train.objectives import vicreg

F64 = torch.float64


pytestmark = pytest.mark.usefixtures("single_thread")


def batch(n: int = 7, d: int = 5, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=F64)


def head(act: str = "gelu", kind: str = "mlp", bn: bool = False, out_dim: int = 4, seed: int = 0) -> ProjectionHead:
    torch.manual_seed(seed)
    return ProjectionHead(5, kind=kind, depth=2, width=6, out_dim=out_dim, act=act, bn_hidden=bn).to(F64)


def with_running_stats(h: ProjectionHead) -> ProjectionHead:
    """Running statistics away from their (0, 1) initial values, so eval and batch modes differ."""
    h.train()
    with torch.no_grad():
        h(batch(64, seed=9) * 2 + 0.5)
    return h


def test_head_jacobian_matches_autograd_per_sample_with_batchnorm_in_eval_mode():
    h = with_running_stats(head("gelu", bn=True))
    z = batch()
    running = h.layers[0][1].running_mean.clone()
    jac = head_jacobian(h, z)
    assert jac.shape == (7, 4, 5)
    h.eval()
    for i in range(len(z)):
        expected = torch.autograd.functional.jacobian(lambda x: h(x[None])[0], z[i])
        torch.testing.assert_close(jac[i], expected, rtol=0, atol=1e-12)
    h.train()
    head_jacobian(h, z)
    assert h.training and torch.equal(h.layers[0][1].running_mean, running)


def test_relu_jacobian_is_the_masked_product_of_the_weights():
    h = head("relu")
    z = batch()
    (w1, b1), w2 = (h.layers[0][0].weight, h.layers[0][0].bias), h.layers[1][0].weight
    mask = (z @ w1.T + b1 > 0).to(F64)
    expected = torch.einsum("od,bd,di->boi", w2, mask, w1)
    torch.testing.assert_close(head_jacobian(h, z), expected.detach(), rtol=0, atol=1e-13)


def test_linear_head_metric_is_constant_with_the_closed_form_spectrum():
    h = head(kind="linear", out_dim=4)
    w = (h.layers[1][0].weight @ h.layers[0][0].weight).detach()
    sv = torch.linalg.svdvals(w)
    out = pullback_metric(h, batch())
    assert out["variation"] < 1e-12
    torch.testing.assert_close(torch.tensor(out["eigenvalues"][:4], dtype=F64), sv.square(), rtol=1e-12, atol=0)
    assert out["eigenvalues"][4] == 0.0
    assert (out["rank"], out["rank_min"], out["rank_max"]) == (4, 4, 4)
    assert out["condition_number"] == pytest.approx(float(sv[0] / sv[3]) ** 2, rel=1e-10)
    assert out["trace"] == pytest.approx(float(w.square().sum()), rel=1e-12)
    assert "1 directions are exactly null" in out["note"]


def test_nonlinear_heads_adapt_the_metric_and_rank_follows_active_units():
    z = batch(32)
    for act in ("gelu", "swish", "tanh", "relu"):
        assert pullback_metric(head(act), z)["variation"] > 0.05, act
    # A ReLU unit off for a sample removes a direction: ranks vary, never above min(width, out, D).
    relu = pullback_metric(head("relu", out_dim=5), z)
    assert relu["rank_max"] <= 5 and relu["rank_min"] < relu["rank_max"]
    assert torch.isfinite(torch.tensor(relu["condition_number"]))


def test_batchnorm_mode_uses_batch_statistics_without_touching_running_ones_and_restores():
    h = with_running_stats(head("relu", bn=True))
    bn = h.layers[0][1]
    before = {k: v.clone() for k, v in h.state_dict().items()}
    h.train()
    z = batch(16)
    with batchnorm_mode(h, "batch"):
        hidden = h.layers[0](z)
        pre = h.layers[0][0](z)
        expected = torch.relu((pre - pre.mean(0)) / torch.sqrt(pre.var(0, unbiased=False) + bn.eps) * bn.weight
                              + bn.bias)
        torch.testing.assert_close(hidden, expected)
    with batchnorm_mode(h, "running"):
        assert not h.training and not bn.training
    assert h.training and bn.training and bn.track_running_stats
    for key, value in h.state_dict().items():
        assert torch.equal(value, before[key]), key
    with pytest.raises(ValueError, match="'running'"):
        with batchnorm_mode(h, "train"):
            pass


def test_degeneracy_is_zero_along_the_null_space_and_one_for_isometries():
    z = batch()
    w = nn.Linear(5, 5, bias=False).to(F64)
    q, _ = torch.linalg.qr(batch(5, 5, seed=1))
    with torch.no_grad():
        w.weight.copy_(q @ torch.diag(torch.tensor([3.0, 2.0, 1.0, 0.0, 0.0], dtype=F64)))
    null = torch.eye(5, dtype=F64)[3:]  # W = Q·diag(3, 2, 1, 0, 0) maps e_4 and e_5 to 0
    tangent = torch.randn(7, 2, generator=torch.Generator().manual_seed(2), dtype=F64) @ null
    out = augmentation_degeneracy(w, z, tangent=tangent)
    assert out["ratio"] < 1e-12
    assert out["isotropic_gain"] == pytest.approx((14 / 5) ** 0.5, rel=1e-12)  # sqrt(tr WᵀW / D)
    views = z + 0.1 * batch(7, 5, seed=3)
    for isometry in (nn.Identity(), nn.Linear(5, 5, bias=False).to(F64)):
        if isinstance(isometry, nn.Linear):
            with torch.no_grad():
                isometry.weight.copy_(q)
        iso = augmentation_degeneracy(isometry, z, z_views=views)
        for key in ("ratio", "ratio_between", "tangent_gain", "secant_gain"):
            assert iso[key] == pytest.approx(1.0, rel=1e-12), key


def test_isotropic_gain_is_the_rms_gain_over_random_directions():
    h, z = head("tanh"), batch(4)
    out = augmentation_degeneracy(h, z, tangent=torch.ones(4, 5, dtype=F64))
    jac = head_jacobian(h, z)
    u = torch.randn(4, 20000, 5, generator=torch.Generator().manual_seed(4), dtype=F64)
    gains = torch.einsum("bod,bkd->bko", jac, u).square().sum(-1) / u.square().sum(-1)
    assert out["isotropic_gain"] == pytest.approx(float(gains.mean().sqrt()), rel=0.02)


def test_secant_gain_matches_the_tangent_gain_for_small_steps_and_views_may_be_an_orbit():
    h, z = head("swish"), batch()
    direction = batch(7, 5, seed=5)
    orbit = z[:, None] + 1e-6 * torch.stack([direction, 2 * direction, -direction], dim=1)
    out = augmentation_degeneracy(h, z, z_views=orbit)
    assert out["n_tangents"] == 21
    assert out["secant_gain"] == pytest.approx(out["tangent_gain"], rel=1e-4)


def test_degeneracy_checks_its_arguments():
    h, z = head(), batch()
    with pytest.raises(ValueError, match="exactly one"):
        augmentation_degeneracy(h, z)
    with pytest.raises(ValueError, match="every tangent is zero"):
        augmentation_degeneracy(h, z, z_views=z)
    with pytest.raises(ValueError, match=r"\(7, 5\) or \(7, K, 5\)"):
        augmentation_degeneracy(h, z, tangent=torch.ones(6, 5, dtype=F64))
    with pytest.raises(ValueError, match="batch of representations"):
        pullback_metric(h, torch.ones(5, dtype=F64))


def test_a_head_trained_for_invariance_collapses_the_augmentation_directions():
    """Claim 5 on a toy: views differ only in 3 nuisance dimensions, VICReg trains the head to ignore them."""
    gen = torch.Generator().manual_seed(0)

    def views(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        content = torch.cat([torch.randn(n, 3, generator=gen, dtype=F64), torch.zeros(n, 3, dtype=F64)], 1)
        nuisance = [torch.cat([torch.zeros(n, 3, dtype=F64), torch.randn(n, 3, generator=gen, dtype=F64)], 1)
                    for _ in range(2)]
        return content + nuisance[0], content + nuisance[1]

    torch.manual_seed(0)
    h = ProjectionHead(6, depth=2, width=32, out_dim=6, act="gelu", bn_hidden=False).to(F64)
    v1, v2 = views()
    before = augmentation_degeneracy(h, v1, z_views=v2)
    optimizer = torch.optim.Adam(h.parameters(), lr=1e-2)
    for _ in range(200):
        a, b = views()
        loss = vicreg(h(a), h(b)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = augmentation_degeneracy(h, v1, z_views=v2)
    assert before["ratio"] > 0.7
    assert after["ratio"] < 0.15 and after["ratio_between"] < 0.15
    assert after["secant_gain"] < 0.15 * after["isotropic_gain"]
