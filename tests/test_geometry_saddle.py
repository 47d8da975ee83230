"""geometry.saddle: λ_min of collapsed toy heads whose sign is known in closed form, and the constructed states."""

import pytest
import torch
from torch import nn

from headprobe.geometry.bn_share import frozen_statistics, head_bn_split
from headprobe.geometry.gm_split import SplitOperators
from headprobe.geometry.saddle import SaddleSpec, arms_for, collapsed_states, state_curvature
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
    spec = SaddleSpec(seeds=(0, 1), states=3, loss="target", arms=("none",))
    states = collapsed_states(spec, ProjectionHead)
    assert len(states) == 4 * 2 * 3 and all(s.collapsed for s in states)
    negative = {h: sum(s.negative for s in states if s.head == h) for h in spec.heads}
    assert negative == {"linear": 0, "relu": 0, "swish": 6, "gelu": 6}
    assert all(s.rayleigh_head < 0 for s in states if s.head in ("swish", "gelu"))
    # Without BatchNorm the head's BatchNorm share is exactly 0 and its M-term is the activation's.
    assert all(s.rayleigh_head_bn == 0.0 and s.rayleigh_head_act == s.rayleigh_head for s in states)
    first = [s for s in states if s.seed == 0 and s.index == 0]
    assert len({s.out_std for s in first}) == 4  # one batch, four different heads


def test_spec_checks_its_arguments():
    with pytest.raises(ValueError, match="unknown here"):
        SaddleSpec(heads=("tanh",))
    with pytest.raises(ValueError, match="loss"):
        SaddleSpec(loss="mse")
    with pytest.raises(ValueError, match="saddle arm 'bn_out' is unknown"):
        SaddleSpec(arms=("none", "bn_out"))


def bn_head(act: nn.Module) -> nn.Sequential:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(3, 5, bias=False), nn.BatchNorm1d(5), act, nn.Linear(5, 2)).double()


def bn_case(act: nn.Module):
    head = bn_head(act)
    z = torch.randn(12, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
    targets = torch.randn(12, 2, generator=torch.Generator().manual_seed(1), dtype=F64)
    v = torch.randn(36, generator=torch.Generator().manual_seed(2), dtype=F64)
    return head, z, (lambda h: 0.5 * ((h - targets) ** 2).sum()), v / v.norm()


def m_quotient(head, loss, z, v) -> float:
    return float(v @ SplitOperators(head, loss, z).m_product(v))


def test_relu_head_with_batchnorm_on_batch_statistics_has_an_m_term_that_is_all_batchnorms():
    head, z, loss, v = bn_case(nn.ReLU())
    whole = m_quotient(head, loss, z, v)
    split = head_bn_split(head, loss, z, v)
    assert abs(whole) > 1e-3  # BatchNorm's 1/s is smooth in every sample of the batch
    assert split["rayleigh_head_act"] == 0.0  # with the statistics held fixed a ReLU head is piecewise linear
    assert split["rayleigh_head_bn"] == pytest.approx(whole, rel=1e-12)
    assert split["frozen_gap"] < 1e-13


def test_relu_head_with_batchnorm_in_eval_mode_has_no_m_term():
    head, z, loss, v = bn_case(nn.ReLU())
    head.eval()
    assert m_quotient(head, loss, z, v) == 0.0
    split = head_bn_split(head, loss, z, v)
    assert split["rayleigh_head_act"] == 0.0 and split["rayleigh_head_bn"] == 0.0


def test_swish_head_splits_exactly_and_without_batchnorm_is_all_activation():
    head, z, loss, v = bn_case(nn.SiLU())
    whole = m_quotient(head, loss, z, v)
    split = head_bn_split(head, loss, z, v)
    assert split["rayleigh_head_act"] != 0.0 and split["rayleigh_head_bn"] != 0.0
    assert split["rayleigh_head_act"] + split["rayleigh_head_bn"] == pytest.approx(whole, rel=1e-12)
    plain = nn.Sequential(head[0], nn.SiLU(), head[3])  # the same weights without BatchNorm
    split = head_bn_split(plain, loss, z, v)
    assert split["rayleigh_head_bn"] == 0.0
    assert split["rayleigh_head_act"] == pytest.approx(m_quotient(plain, loss, z, v), rel=1e-12)


def test_frozen_statistics_are_the_batch_statistics_and_leave_the_head_alone():
    head, z, _, _ = bn_case(nn.ReLU())
    before = head[1].running_mean.clone()
    frozen = frozen_statistics(head, z)
    assert not frozen.training and head.training
    assert torch.equal(head[1].running_mean, before)
    assert torch.allclose(frozen[1].running_mean, head[0](z).mean(0), atol=1e-15)
    assert torch.allclose(frozen(z), head(z), atol=1e-13)


def test_batchnorm_arms_are_answered_apart_and_the_target_loss_has_no_predictor_arms():
    assert arms_for("target", ("none", "bn_head", "bn_predictor", "bn_both")) == ("none", "bn_head")
    spec = SaddleSpec(heads=("relu", "swish"), seeds=(0,), states=2, loss="target", arms=("none", "bn_head"))
    states = collapsed_states(spec, ProjectionHead)
    assert sorted({s.label for s in states}) == ["relu", "relu+bn_head", "swish", "swish+bn_head"]
    relu_bn = [s for s in states if s.label == "relu+bn_head"]
    # A ReLU head's M-term with BatchNorm on batch statistics is BatchNorm's alone, and not zero.
    assert all(s.rayleigh_head_act == 0.0 and s.rayleigh_head_bn == s.rayleigh_head != 0.0 for s in relu_bn)
    swish = [s for s in states if s.label == "swish"]
    assert all(s.rayleigh_head_bn == 0.0 and s.rayleigh_head_act < 0 for s in swish)
    simsiam = collapsed_states(SaddleSpec(heads=("relu",), seeds=(0,), states=1, arms=("bn_predictor",)),
                               ProjectionHead)
    assert [s.label for s in simsiam] == ["relu+bn_predictor"] and simsiam[0].rayleigh_head == 0.0
