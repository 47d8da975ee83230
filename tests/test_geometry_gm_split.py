"""geometry.gm_split: each part of H and the shares of λ_min against dense float64 Hessians, with a BatchNorm
predictor."""

import pytest
import torch
from test_geometry_tracking import F64, B, collapsed_head, views
from torch import nn

from headprobe.geometry import batchnorm_mode, curvature_snapshot, dense_hessian
from headprobe.train.heads import Predictor
from headprobe.train.objectives import simsiam, vicreg

pytestmark = pytest.mark.usefixtures("single_thread")


def dense_parts(head: nn.Module, predictor: nn.Module, z1: torch.Tensor, z2: torch.Tensor, objective) -> dict:
    """Dense H (predictor BatchNorm on batch statistics), H_run (on running statistics), M, J, A and A_run."""
    from torch.func import jacrev

    def pair(z):
        return torch.cat([head(z[:B]), head(z[B:])])

    def loss_of_h(h):
        return objective(h[:B], h[B:])

    z = torch.cat([z1, z2])
    out = {}
    with batchnorm_mode([head, predictor], "batch"):
        h0 = pair(z).detach()
        grad_h = torch.func.grad(loss_of_h)(h0).detach()
        out["H"] = dense_hessian(lambda x: loss_of_h(pair(x)), z).detach()
        out["A"] = dense_hessian(loss_of_h, h0).detach()
        out["J"] = jacrev(pair)(z).reshape(h0.numel(), z.numel()).detach()
        out["M"] = dense_hessian(lambda x: (grad_h * pair(x)).sum(), z).detach()
        with batchnorm_mode(predictor, "running"):
            out["H_run"] = dense_hessian(lambda x: loss_of_h(pair(x)), z).detach()
            out["A_run"] = dense_hessian(loss_of_h, h0).detach()
    return out


def trained_predictor(seed: int) -> Predictor:
    """A predictor whose BatchNorm running statistics differ from the batch's (a few forward passes in train mode)."""
    torch.manual_seed(seed)
    predictor = Predictor(8, 4).to(F64)
    predictor.train()
    with torch.no_grad():
        for _ in range(3):
            predictor(torch.randn(16, 8, dtype=F64) * 2 + 1)
    return predictor.eval()


@pytest.mark.parametrize("kind,act,bn", [("linear", "relu", False), ("mlp", "relu", False), ("mlp", "swish", True)])
def test_shares_at_the_lambda_min_eigenvector_match_dense_parts_with_a_batchnorm_predictor(kind, act, bn):
    """Each recorded part against dense float64 Hessians: λ_min of H with the predictor's BatchNorm on running
    statistics, and the Rayleigh quotients vᵀMv, (Jv)ᵀA_run(Jv), (Jv)ᵀ(A − A_run)(Jv) at λ_min's eigenvector v,
    which add up to λ_min; the source is the most negative of them."""
    z1, z2 = views(7)
    head = collapsed_head(act, kind, bn, seed=1)
    predictor = trained_predictor(8)

    def objective(h1, h2):
        return simsiam(predictor(h1), predictor(h2), h1, h2).loss

    out = curvature_snapshot(head, z1, z2, objective, tol=1e-10, max_iter=64, predictor=predictor, split=True)
    d = dense_parts(head, predictor, z1, z2, objective)
    values, vectors = torch.linalg.eigh((d["H"] + d["H"].T) / 2)
    scale = float(values.abs().max())
    assert out["lambda_min"] == pytest.approx(float(values[0]), abs=1e-8 * scale)
    run = torch.linalg.eigvalsh((d["H_run"] + d["H_run"].T) / 2)
    assert out["predictor_batchnorm"] is True
    assert out["lambda_min_predictor_bn_running"] == pytest.approx(float(run[0]), abs=1e-8 * float(run.abs().max()))
    assert abs(float(run[0]) - float(values[0])) > 1e-6 * scale  # the predictor's BatchNorm mode matters here
    v = vectors[:, 0]
    jv = d["J"] @ v
    exact = {"head": float(v @ d["M"] @ v), "objective": float(jv @ d["A_run"] @ jv),
             "predictor_bn": float(jv @ (d["A"] - d["A_run"]) @ jv)}
    assert sum(exact.values()) == pytest.approx(float(values[0]), abs=1e-9 * scale)
    for part, q in exact.items():
        assert out[f"rayleigh_{part}"] == pytest.approx(q, abs=1e-6 * scale), part
        assert out[f"share_{part}"] == pytest.approx(q / float(values[0]), abs=1e-4), part
    assert out["rayleigh_sum"] == pytest.approx(float(values[0]), abs=1e-6 * scale)
    if kind == "linear" or not bn and act == "relu":
        assert out["rayleigh_head"] == 0.0  # M = 0 exactly: no share for the head
    expected = min(exact, key=exact.get) if out["negative_beyond_bound"] else "none"
    assert out["curvature_source"] == expected


def test_a_predictor_without_batchnorm_has_no_predictor_share_and_the_head_share_decides():
    """No predictor BatchNorm: A_run = A, the predictor_bn quotient is 0; under a loss convex in h (alignment) a
    Swish head's negative λ_min is the head's by share, as the M-term is its only negative part."""
    z1, z2 = views(5)

    def align(h1, h2):
        return vicreg(h1, h2, var_weight=0.0, cov_weight=0.0)

    out = curvature_snapshot(collapsed_head("swish"), z1, z2, align, tol=1e-9, max_iter=64, split=True)
    assert out["predictor_batchnorm"] is False and "lambda_min_predictor_bn_running" not in out
    assert out["rayleigh_predictor_bn"] == 0.0 and out["rayleigh_objective"] >= 0
    assert out["curvature_source"] == "head" and out["share_head"] > 1.0 - 1e-9
