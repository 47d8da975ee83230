"""geometry.saddle: λ_min of collapsed toy heads whose sign is known in closed form, and the constructed states."""

import pytest
import torch
from torch import nn

from headprobe.geometry.saddle import SaddleSpec, collapsed_states, state_curvature
from headprobe.train.heads import ProjectionHead

pytestmark = pytest.mark.usefixtures("single_thread")
F64 = torch.float64


def one_unit(act: nn.Module) -> nn.Sequential:
    head = nn.Sequential(nn.Linear(1, 1, bias=False), act, nn.Linear(1, 1, bias=False)).double()
    with torch.no_grad():
        head[0].weight.fill_(1.0)
        head[2].weight.fill_(1.0)
    return head


@pytest.mark.parametrize(("t", "expected"), [(1.0, -0.25), (0.25, 0.125), (0.0, 0.25)])
def test_swish_unit_at_collapse_has_the_closed_form_eigenvalue(t, expected):
    # h(z) = silu(z) with every sample at z = 0 (collapsed): h = 0, h' = 1/2, h'' = 1/2, so ½ Σ (h − t)² has the
    # diagonal Hessian (h')² + (h − t)·h'' = 1/4 − t/2: a strict saddle exactly when t > 1/2.
    head = one_unit(nn.SiLU())
    z = torch.zeros(3, 1, dtype=F64)
    out = state_curvature(head, lambda h: 0.5 * ((h - t) ** 2).sum(), z, z)
    assert out["lambda_min"] == pytest.approx(expected, abs=1e-14)
    assert out["lambda_max"] == pytest.approx(expected, abs=1e-14)
    assert out["negative"] is (expected < 0)
    assert out["rayleigh_head"] == pytest.approx(-t / 2, abs=1e-14)


@pytest.mark.parametrize("act", [nn.ReLU(), nn.Identity()])
def test_piecewise_linear_unit_at_collapse_is_not_a_saddle(act):
    # h(z) = z on z > 0: the Hessian of ½ Σ (h − t)² is (h')² = 1 whatever t, λ_min = 1, and the M-term is 0.
    head = one_unit(act)
    z = torch.full((3, 1), 0.1, dtype=F64)
    out = state_curvature(head, lambda h: 0.5 * ((h - 2.0) ** 2).sum(), z, z)
    assert out["lambda_min"] == pytest.approx(1.0, abs=1e-13)
    assert out["negative"] is False and out["rayleigh_head"] == 0.0


def test_constructed_states_are_collapsed_and_only_smooth_heads_are_saddles_of_the_target_loss():
    spec = SaddleSpec(seeds=(0, 1), states=3, loss="target")
    states = collapsed_states(spec, ProjectionHead)
    assert len(states) == 4 * 2 * 3 and all(s.collapsed for s in states)
    negative = {h: sum(s.negative for s in states if s.head == h) for h in spec.heads}
    assert negative == {"linear": 0, "relu": 0, "swish": 6, "gelu": 6}
    assert all(s.rayleigh_head < 0 for s in states if s.head in ("swish", "gelu"))
    first = [s for s in states if s.seed == 0 and s.index == 0]
    assert len({s.out_std for s in first}) == 4  # one batch, four different heads


def test_spec_checks_its_arguments():
    with pytest.raises(ValueError, match="unknown here"):
        SaddleSpec(heads=("tanh",))
    with pytest.raises(ValueError, match="loss"):
        SaddleSpec(loss="mse")
