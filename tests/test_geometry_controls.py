"""geometry.controls: λ_min under each control against dense float64 Hessians of the same variant."""

import pytest
import torch
from test_geometry_gm_split import trained_predictor
from test_geometry_tracking import F64, B, collapsed_head, views
from torch import nn

from headprobe.geometry import batchnorm_mode, curvature_snapshot, dense_hessian
from headprobe.train.objectives import simsiam

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.mark.parametrize("act,bn", [("relu", False), ("swish", False), ("relu", True)])
def test_controls_match_dense_hessians_of_each_variant(act, bn):
    """swapped_act and head_curvature against dense float64 Hessians of the same variant; under head_curvature's
    loss (convex in h, gradient ≠ 0) a ReLU head without BatchNorm has no negative curvature (M = 0) while a Swish
    head at the same state has some. A BatchNorm head's share splits exactly into its activation's and its
    BatchNorm's (all BatchNorm's for ReLU+BN)."""
    from headprobe.geometry.controls import swapped_activation, target_loss

    z1, z2 = views(9)
    head = collapsed_head(act, "mlp", bn, seed=2)
    predictor = trained_predictor(3)

    def objective(h1, h2):
        return simsiam(predictor(h1), predictor(h2), h1, h2).loss

    out = curvature_snapshot(head, z1, z2, objective, tol=1e-10, max_iter=64, predictor=predictor, controls=True,
                             split=True)
    swapped, label = swapped_activation(head)
    assert out["swapped_act"] == label == ("ReLU→SiLU" if act == "relu" else "SiLU→ReLU")
    z = torch.cat([z1, z2])
    with batchnorm_mode([head, predictor, swapped], "batch"):
        targets = target_loss(torch.Size([2 * B, 8]), F64, "cpu", 3)
        exact = {
            "swapped_act": dense_hessian(lambda x: objective(swapped(x[:B]), swapped(x[B:])), z),
            "head_curvature": dense_hessian(lambda x: targets(torch.cat([head(x[:B]), head(x[B:])])), z),
        }
    for name, h in exact.items():
        values = torch.linalg.eigvalsh((h.detach() + h.detach().T) / 2)
        assert out[f"lambda_min_{name}"] == pytest.approx(float(values[0]), abs=1e-8 * float(values.abs().max())), name
    assert out["controls"] == ["swapped_act", "head_curvature"]
    assert "lambda_min_no_predictor" not in out
    if act == "relu" and not bn:
        assert not out["negative_head_curvature"]
    if act == "swish":
        assert out["negative_head_curvature"]
    if bn:
        assert out["rayleigh_head_act"] + out["rayleigh_head_bn"] == pytest.approx(out["rayleigh_head"], abs=1e-12)
        assert out["rayleigh_head_act"] == 0.0 and out["rayleigh_head_bn"] != 0.0  # ReLU: M is all BatchNorm's
        assert out["share_head_act"] + out["share_head_bn"] == pytest.approx(out["share_head"], abs=1e-9)
    else:
        assert "share_head_bn" not in out


@pytest.mark.parametrize("act", ["relu", "swish", "gelu"])
def test_without_the_predictor_collapse_is_a_minimum_for_every_head_so_no_predictor_was_dropped(act):
    """Why "no_predictor" is not a control: with both views' outputs equal (collapse), SimSiam's cosine on h itself
    is at its minimum, so ∇_h L = 0 (no M-term, whatever the head) and the dense Hessian w.r.t. z is PSD for every
    head, BatchNorm on batch statistics included: it cannot separate one head from another."""
    z1, _ = views(9)
    head = collapsed_head(act, "mlp", True, seed=2)
    z = torch.cat([z1, z1])

    def cosine(h):  # SimSiam's loss without the predictor and without the stop-gradient (the loss function itself)
        return -nn.functional.cosine_similarity(h[:B], h[B:], dim=1).mean()

    with batchnorm_mode([head], "batch"):
        hh = torch.cat([head(z[:B]), head(z[B:])]).detach().requires_grad_(True)
        grad_h = torch.autograd.grad(cosine(hh), hh)[0]
        hess = dense_hessian(lambda x: cosine(torch.cat([head(x[:B]), head(x[B:])])), z).detach()
        values = torch.linalg.eigvalsh((hess + hess.T) / 2)
    assert float(grad_h.abs().max()) < 1e-12
    assert float(values[0]) >= -1e-10 * float(values.abs().max())


def test_swapped_activation_leaves_a_linear_head_alone_and_copies_the_weights():
    from headprobe.geometry.controls import swapped_activation

    assert swapped_activation(collapsed_head("relu", "linear")) is None
    head = collapsed_head("gelu")
    twin, label = swapped_activation(head)
    assert label == "GELU→ReLU" and isinstance(head.layers[0][-1], nn.GELU)
    assert all(torch.equal(a, b) for a, b in zip(head.parameters(), twin.parameters(), strict=True))
