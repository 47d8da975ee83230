import math

import pytest
import torch
from torch import nn

from headprobe.geometry import batchnorm_mode, collapse_start, curvature_snapshot, dense_hessian, symmetric_simsiam
from headprobe.probes.spectrum import rankme
from headprobe.train.heads import Predictor, ProjectionHead
from headprobe.train.objectives import simsiam, vicreg

F64 = torch.float64
B, D = 4, 8


pytestmark = pytest.mark.usefixtures("single_thread")


def views(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + seed)
    base = torch.randn(B, D, generator=g, dtype=F64)
    return (base + 0.3 * torch.randn(B, D, generator=g, dtype=F64),
            base + 0.3 * torch.randn(B, D, generator=g, dtype=F64))


def collapsed_head(act: str, kind: str = "mlp", bn: bool = False, seed: int = 0) -> ProjectionHead:
    torch.manual_seed(seed)
    return collapse_start(ProjectionHead(D, kind=kind, depth=2, width=16, out_dim=8, act=act, bn_hidden=bn).to(F64))


def dense_extremes(head: nn.Module, z1: torch.Tensor, z2: torch.Tensor, objective, modules) -> torch.Tensor:
    with batchnorm_mode(modules, "batch"):
        h = dense_hessian(lambda z: objective(head(z[:B]), head(z[B:])), torch.cat([z1, z2]))
    return torch.linalg.eigvalsh(h.detach())


def assert_matches_dense(out: dict, exact: torch.Tensor, tol: float) -> None:
    scale = float(exact.abs().max())
    assert out["converged"]
    assert abs(out["lambda_min"] - float(exact[0])) < tol * scale
    assert abs(out["lambda_max"] - float(exact[-1])) < tol * scale
    assert out["residual_min"] < tol * max(out["scale"], abs(out["lambda_min"]))


def test_lanczos_extremes_match_the_dense_hessian_at_a_collapsed_start_vicreg():
    z1, z2 = views()
    head = collapsed_head("gelu", bn=True)

    def objective(h1, h2):
        return vicreg(h1, h2)

    out = curvature_snapshot(head, z1, z2, objective, tol=1e-6)
    exact = dense_extremes(head, z1, z2, lambda a, b: vicreg(a, b).loss, head)
    assert out["dim"] == 2 * B * D == 64
    assert_matches_dense(out, exact, 1e-6)
    assert out["n_hvp"] == out["n_iter"] + 1  # one product for the scale
    assert out["n_iter"] < 64
    with batchnorm_mode(head, "batch"), torch.no_grad():
        assert out["loss"] == pytest.approx(vicreg(head(z1), head(z2)).loss.item(), rel=1e-12)


def test_lanczos_extremes_match_the_dense_hessian_for_simsiam_with_its_predictor():
    """k = 2 from each end; the predictor's BatchNorm runs on batch statistics like the head's."""
    z1, z2 = views(1)
    head = collapsed_head("gelu", bn=True)
    torch.manual_seed(1)
    predictor = Predictor(8, 4).to(F64)
    objective = symmetric_simsiam(predictor)
    out = curvature_snapshot(head, z1, z2, objective, k=2, tol=1e-6, predictor=predictor)
    exact = dense_extremes(head, z1, z2, objective, [head, predictor])
    assert_matches_dense(out, exact, 1e-6)
    torch.testing.assert_close(torch.tensor(out["eigenvalues"], dtype=F64), torch.cat([exact[:2], exact[-2:]]),
                               rtol=0, atol=1e-6 * float(exact.abs().max()))


def test_few_iterations_still_bracket_the_spectrum_and_say_they_did_not_converge():
    z1, z2 = views(2)
    head = collapsed_head("tanh")
    exact = dense_extremes(head, z1, z2, lambda a, b: vicreg(a, b).loss, head)
    out = curvature_snapshot(head, z1, z2, vicreg, tol=1e-12, max_iter=6)
    assert not out["converged"] and out["n_iter"] == 6
    assert float(exact[0]) - 1e-12 <= out["lambda_min"] <= out["lambda_max"] <= float(exact[-1]) + 1e-12


def test_hessian_with_respect_to_head_parameters_matches_dense():
    z1, z2 = views(3)
    head = collapsed_head("gelu")
    out = curvature_snapshot(head, z1, z2, vicreg, wrt="head", tol=1e-6, max_iter=200)
    with batchnorm_mode(head, "batch"):
        exact = torch.linalg.eigvalsh(dense_hessian(lambda m: vicreg(m(z1), m(z2)).loss, head).detach())
    assert out["dim"] == sum(p.numel() for p in head.parameters())
    assert_matches_dense(out, exact, 1e-6)


def test_a_snapshot_leaves_the_training_state_untouched():
    z1, z2 = views()
    head = collapsed_head("relu", bn=True)
    torch.manual_seed(5)
    predictor = Predictor(8, 4).to(F64)
    loss = simsiam(predictor(head(z1)), predictor(head(z2)), head(z1), head(z2)).loss
    loss.backward()
    state = {k: v.clone() for k, v in [*head.state_dict().items(), *predictor.state_dict().items()]}
    params = [*head.parameters(), *predictor.parameters()]
    grads = [p.grad.clone() for p in params]
    rng = torch.get_rng_state()
    curvature_snapshot(head, z1, z2, lambda a, b: simsiam(predictor(a), predictor(b), a, b), predictor=predictor)
    after = dict([*head.state_dict().items(), *predictor.state_dict().items()])
    assert all(torch.equal(v, after[k]) for k, v in state.items())
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, params, strict=True))
    assert torch.equal(rng, torch.get_rng_state())
    assert head.training and predictor.training


def test_stop_gradient_freezes_the_targets_and_symmetric_simsiam_keeps_the_value():
    z1, z2 = views(4)
    head = collapsed_head("gelu")
    torch.manual_seed(2)
    predictor = nn.Linear(8, 8).to(F64)
    with_stop = lambda a, b: simsiam(predictor(a), predictor(b), a, b).loss  # noqa: E731
    without = symmetric_simsiam(predictor)
    with torch.no_grad():
        h1, h2 = head(z1), head(z2)
        assert without(h1, h2).item() == pytest.approx(with_stop(h1, h2).item(), rel=1e-12)
    frozen = dense_hessian(lambda z: with_stop(head(z[:B]), head(z[B:])), torch.cat([z1, z2])).detach()
    full = dense_hessian(lambda z: without(head(z[:B]), head(z[B:])), torch.cat([z1, z2])).detach()
    cross = slice(0, B * D), slice(B * D, 2 * B * D)
    assert frozen[cross].abs().max() == 0 and full[cross].abs().max() > 1e-3 * full.abs().max()


@pytest.mark.parametrize("seed", [0, 1])
def test_under_a_loss_convex_in_h_only_smooth_heads_and_batchnorm_give_negative_curvature(seed):
    """Claim 4's mechanism: with ∇²_h L ⪰ 0 (alignment only), H_eff = JᵀAJ + M; linear and ReLU heads have M = 0,
    so λ_min ≥ 0 (up to round-off); smooth heads, and BatchNorm on batch statistics, add an indefinite M-term."""
    z1, z2 = views(seed)

    def align(h1, h2):
        return vicreg(h1, h2, var_weight=0.0, cov_weight=0.0)

    ratios = {}
    for name, (kind, act, bn) in {"linear": ("linear", "relu", False), "relu": ("mlp", "relu", False),
                                  "swish": ("mlp", "swish", False), "gelu": ("mlp", "gelu", False),
                                  "relu+bn": ("mlp", "relu", True)}.items():
        out = curvature_snapshot(collapsed_head(act, kind, bn, seed), z1, z2, align, tol=1e-10, max_iter=64)
        assert out["converged"], name
        ratios[name] = (out["lambda_min"] / out["lambda_max"], out["negative_curvature"])
    for name in ("linear", "relu"):
        assert ratios[name][0] > -1e-10 and not ratios[name][1], (name, ratios)
    for name in ("swish", "gelu", "relu+bn"):
        assert ratios[name][0] < -1e-4 and ratios[name][1], (name, ratios)


def test_output_statistics_and_an_exactly_collapsed_head():
    z1, z2 = views()
    head = collapsed_head("gelu")
    out = curvature_snapshot(head, z1, z2, vicreg)
    h1 = head(z1).detach()
    assert out["out_std"] == pytest.approx(float(nn.functional.normalize(h1, dim=1).std(0).mean()), rel=1e-12)
    assert out["out_std_uniform"] == pytest.approx(1 / math.sqrt(8))
    assert out["rankme"] == pytest.approx(rankme(h1), rel=1e-12)
    assert out["cov_numerical_rank"] == B - 1 and out["cov_condition_scope"] == "top_k"
    assert len(out["cov_top_eigenvalues"]) == B
    dead = collapse_start(ProjectionHead(D, kind="linear", depth=2, width=16, out_dim=8).to(F64), 0.0)
    flat = curvature_snapshot(dead, z1, z2, lambda a, b: (a - b).square().sum())
    assert flat["lambda_min"] == flat["lambda_max"] == 0.0 and not flat["negative_curvature"]
    assert flat["out_std"] is None and flat["rankme"] is None and flat["cov_effective_rank"] is None


def test_snapshot_checks_its_arguments():
    z1, z2 = views()
    head = collapsed_head("gelu")
    with pytest.raises(ValueError, match="wrt"):
        curvature_snapshot(head, z1, z2, vicreg, wrt="backbone")
    with pytest.raises(ValueError, match="two views"):
        curvature_snapshot(head, z1, z2[:3], vicreg)
    with pytest.raises(ValueError, match="floating-point batch"):
        curvature_snapshot(head, z1[0], z2, vicreg)
    with pytest.raises(ValueError, match="split"):
        curvature_snapshot(head, z1, z2, vicreg, wrt="head", split=True)
    with pytest.raises(ValueError, match="stat_rows must be representations"):
        curvature_snapshot(head, z1, z2, vicreg, stat_rows=torch.zeros(5, D + 1, dtype=F64))


def dense_split(head: nn.Module, z1: torch.Tensor, z2: torch.Tensor, objective, modules) -> dict:
    """H, G = JᵀAJ, M and A = ∇²_h L by torch.func (hessian, jacrev), each view through the head on its own."""
    from torch.func import jacrev

    def pair(z):
        return torch.cat([head(z[:B]), head(z[B:])])

    def loss_of_h(h):
        return objective(h[:B], h[B:])

    z = torch.cat([z1, z2])
    with batchnorm_mode(modules, "batch"):
        h0 = pair(z).detach()
        grad_h = torch.func.grad(loss_of_h)(h0).detach()
        full = dense_hessian(lambda x: loss_of_h(pair(x)), z).detach()
        a = dense_hessian(loss_of_h, h0).detach()
        jac = jacrev(pair)(z).reshape(h0.numel(), z.numel()).detach()
        m = dense_hessian(lambda x: (grad_h * pair(x)).sum(), z).detach()
    return {"H": full, "G": jac.T @ a @ jac, "M": m, "A": a}


@pytest.mark.parametrize("kind,act,bn", [("linear", "relu", False), ("mlp", "relu", False),
                                         ("mlp", "gelu", False), ("mlp", "gelu", True)])
def test_split_matches_dense_g_and_m_terms_and_the_loss_hessian_in_h(kind, act, bn):
    z1, z2 = views(3)
    head = collapsed_head(act, kind, bn)
    torch.manual_seed(4)
    predictor = Predictor(8, 4).to(F64)

    def objective(h1, h2):
        return simsiam(predictor(h1), predictor(h2), h1, h2).loss

    out = curvature_snapshot(head, z1, z2, objective, tol=1e-9, max_iter=64, predictor=predictor, split=True)
    exact = dense_split(head, z1, z2, objective, [head, predictor])
    eig = {key: torch.linalg.eigvalsh((m + m.T) / 2) for key, m in exact.items()}
    torch.testing.assert_close(exact["G"] + exact["M"], exact["H"], rtol=0, atol=1e-12 * float(eig["H"].abs().max()))
    h_norm = float(eig["H"].abs().max())
    assert out["split_converged"] and out["split_consistency"] < 1e-10
    for key, term in (("gterm", "G"), ("mterm", "M"), ("loss_h", "A")):
        scale = max(float(eig[term].abs().max()), 1e-300)
        assert out[f"lambda_min_{key}"] == pytest.approx(float(eig[term][0]), abs=1e-7 * scale), key
        assert out[f"lambda_max_{key}"] == pytest.approx(float(eig[term][-1]), abs=1e-7 * scale), key
    m_ratio = float(eig["M"].abs().max()) / h_norm
    assert out["m_norm_ratio"] == pytest.approx(m_ratio, rel=1e-6, abs=1e-12)
    assert (m_ratio == 0) == (kind == "linear" or (act == "relu" and not bn))
    assert out["dim_loss_h"] == 2 * B * 8 and out["gterm_predictor"] == "in the loss"
    assert eig["A"][0] < -1e-3 * eig["A"].abs().max()  # SimSiam's ∇²_h L is indefinite (the paper)


def test_negative_curvature_is_attributed_to_the_predictor_under_simsiam_and_to_the_head_under_alignment():
    """SimSiam: the G-term is negative for every head; for a linear head the largest share of λ_min is the
    predictor's BatchNorm on batch statistics (not the head, whose M-term is 0).
    Alignment only (∇²_h L ⪰ 0): the G-term is PSD, linear and ReLU heads are not negative, a Swish head is, and
    that negative curvature comes from its M-term."""
    z1, z2 = views(5)
    torch.manual_seed(6)
    predictor = Predictor(8, 4).to(F64)

    def siam(h1, h2):
        return simsiam(predictor(h1), predictor(h2), h1, h2)

    def align(h1, h2):
        return vicreg(h1, h2, var_weight=0.0, cov_weight=0.0)

    linear = curvature_snapshot(collapsed_head("relu", "linear"), z1, z2, siam, predictor=predictor, tol=1e-9,
                                max_iter=64, split=True)
    assert linear["curvature_source"] == "predictor_bn" and linear["negative_loss_h"] and linear["m_norm_ratio"] == 0.0
    assert linear["negative_gterm"] and linear["rayleigh_head"] == 0.0
    sources = {}
    for act, kind in (("relu", "linear"), ("relu", "mlp"), ("swish", "mlp")):
        out = curvature_snapshot(collapsed_head(act, kind), z1, z2, align, tol=1e-9, max_iter=64, split=True)
        assert not out["negative_loss_h"] and not out["negative_gterm"] and out["gterm_predictor"] == "none"
        sources[f"{kind}-{act}"] = out["curvature_source"]
    assert sources == {"linear-relu": "none", "mlp-relu": "none", "mlp-swish": "head"}


def test_lambda_min_converged_says_whether_lambda_min_matches_the_dense_eigenvalue():
    """The flag against an exact eigen-decomposition: every point flagged converged is within the tolerance of
    the dense λ_min, a short run that is not is flagged so, and the full Krylov space converges."""
    z1, z2 = views(6)
    head = collapsed_head("swish")
    exact = dense_extremes(head, z1, z2, lambda a, b: vicreg(a, b).loss, head)
    tol, flags = 1e-6, {}
    for max_iter in (3, 6, 12, 24, 48, 64):
        out = curvature_snapshot(head, z1, z2, vicreg, tol=tol, max_iter=max_iter)
        allowed = tol * max(out["scale"], abs(out["lambda_min"]))
        error = abs(out["lambda_min"] - float(exact[0]))
        assert out["lambda_min_converged"] == (out["residual_min"] <= allowed), max_iter
        assert out["max_iter"] == max_iter and out["n_iter"] <= max_iter
        if out["lambda_min_converged"]:
            assert error <= allowed, (max_iter, error, allowed)
        flags[max_iter] = (out["lambda_min_converged"], error > allowed, out["converged"])
    assert flags[3][:2] == (False, True)  # three products: far from λ_min, and flagged as such
    assert flags[64][0] and flags[64][2]
    # λ_min's own flag, not the run's: here λ_min converges before λ_max does.
    assert any(own and not both for own, _, both in flags.values()), flags


def test_collapse_statistics_come_from_the_given_rows_in_one_batch_mode_pass():
    z1, z2 = views()
    torch.manual_seed(0)
    head = ProjectionHead(D, depth=2, width=16, out_dim=8, act="gelu", bn_hidden=True).to(F64)
    rows = torch.randn(40, D, generator=torch.Generator().manual_seed(9), dtype=F64)
    out = curvature_snapshot(head, z1, z2, vicreg, stat_rows=rows)
    with batchnorm_mode(head, "batch"), torch.no_grad():
        h = head(rows)
    direct = float((h / h.norm(dim=1, keepdim=True)).std(0).mean())
    s = torch.linalg.svdvals(h)
    p = s / s.sum() + 1e-7
    assert out["stats_rows"] == 40
    assert out["out_std"] == pytest.approx(direct, rel=1e-12)
    assert out["rankme"] == pytest.approx(math.exp(float(-(p * p.log()).sum())), rel=1e-12)
    assert out["rankme"] > B  # RankMe of the 4-row batch could not pass 4
    plain = curvature_snapshot(head, z1, z2, vicreg)
    assert plain["stats_rows"] == B and plain["lambda_min"] == out["lambda_min"]


def test_each_point_says_whether_its_state_is_collapsed_by_the_recorded_criterion():
    z1, z2 = views(2)
    collapsed, spread = collapsed_head("relu"), ProjectionHead(D, depth=2, width=16, out_dim=8, act="relu").to(F64)
    for head, expect in ((collapsed, True), (spread, False)):
        out = curvature_snapshot(head, z1, z2, vicreg, max_iter=8, collapse_threshold=0.1)
        assert out["collapse_bound"] == pytest.approx(0.1 / math.sqrt(8))
        assert out["collapsed"] is expect and (out["out_std"] <= out["collapse_bound"]) is expect
    assert "collapsed" not in curvature_snapshot(collapsed, z1, z2, vicreg, max_iter=8)

