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
    """no_predictor, swapped_act and target_loss against dense float64 Hessians of the same variant; under the
    target loss (convex in h, gradient ≠ 0) a ReLU head without BatchNorm has no negative curvature (M = 0) while
    a Swish head at the same state has some."""
    from headprobe.geometry.controls import swapped_activation, target_loss

    z1, z2 = views(9)
    head = collapsed_head(act, "mlp", bn, seed=2)
    predictor = trained_predictor(3)

    def objective(h1, h2):
        return simsiam(predictor(h1), predictor(h2), h1, h2).loss

    def bare(h1, h2):
        return simsiam(h1, h2, h1, h2).loss

    out = curvature_snapshot(head, z1, z2, objective, tol=1e-10, max_iter=64, predictor=predictor, controls=True,
                             objective_without_predictor=bare)
    swapped, label = swapped_activation(head)
    assert out["swapped_act"] == label == ("ReLU→SiLU" if act == "relu" else "SiLU→ReLU")
    z = torch.cat([z1, z2])
    with batchnorm_mode([head, predictor, swapped], "batch"):
        targets = target_loss(torch.Size([2 * B, 8]), F64, "cpu", 3)
        exact = {
            "no_predictor": dense_hessian(lambda x: bare(head(x[:B]), head(x[B:])), z),
            "swapped_act": dense_hessian(lambda x: objective(swapped(x[:B]), swapped(x[B:])), z),
            "target_loss": dense_hessian(lambda x: targets(torch.cat([head(x[:B]), head(x[B:])])), z),
        }
    for name, h in exact.items():
        values = torch.linalg.eigvalsh((h.detach() + h.detach().T) / 2)
        assert out[f"lambda_min_{name}"] == pytest.approx(float(values[0]), abs=1e-8 * float(values.abs().max())), name
    assert out["controls"] == ["no_predictor", "swapped_act", "target_loss"]
    if act == "relu" and not bn:
        assert not out["negative_target_loss"]
    if act == "swish":
        assert out["negative_target_loss"]


def test_swapped_activation_leaves_a_linear_head_alone_and_copies_the_weights():
    from headprobe.geometry.controls import swapped_activation

    assert swapped_activation(collapsed_head("relu", "linear")) is None
    head = collapsed_head("gelu")
    twin, label = swapped_activation(head)
    assert label == "GELU→ReLU" and isinstance(head.layers[0][-1], nn.GELU)
    assert all(torch.equal(a, b) for a, b in zip(head.parameters(), twin.parameters(), strict=True))
