import pytest
import torch

from headprobe.train.heads import Predictor, ProjectionHead


def test_mlp_layout_no_bias_before_bn_and_taps():
    head = ProjectionHead(16, depth=3, width=32, out_dim=8, act="swish", bn_hidden=True, bn_out=True)
    linears = [m for m in head.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features, m.bias is None) for m in linears] == [
        (16, 32, True), (32, 32, True), (32, 8, True)]
    assert sum(isinstance(m, torch.nn.BatchNorm1d) for m in head.modules()) == 3
    assert sum(isinstance(m, torch.nn.SiLU) for m in head.modules()) == 2
    x = torch.randn(5, 16)
    taps = head.taps(x)
    assert [t.shape for t in taps] == [(5, 32), (5, 32), (5, 8)]
    torch.testing.assert_close(head(x), taps[-1])


def test_mlp_without_bn_keeps_biases_and_output_has_no_activation():
    head = ProjectionHead(4, depth=2, width=6, act="relu", bn_hidden=False).eval()
    assert all(m.bias is not None for m in head.modules() if isinstance(m, torch.nn.Linear))
    out = head(torch.randn(50, 4))
    assert (out < 0).any()  # the last layer is linear, not ReLU'd
    assert (head.taps(torch.randn(50, 4))[0] >= 0).all()  # the hidden tap is post-activation


def test_linear_head_is_bias_free_matrices_only():
    head = ProjectionHead(8, kind="linear", depth=2, width=5, out_dim=3)
    assert [type(m).__name__ for m in head.modules() if not isinstance(m, (torch.nn.Sequential,
                                                                          torch.nn.ModuleList, ProjectionHead))] \
        == ["Linear", "Linear"]
    x = torch.randn(4, 8)
    w1, w2 = (m.weight for m in head.modules() if isinstance(m, torch.nn.Linear))
    torch.testing.assert_close(head(x), x @ w1.T @ w2.T)


def test_identity_init_scale_l2_and_predictor():
    x = torch.randn(3, 7)
    ident = ProjectionHead(7, kind="identity")
    assert ident.taps(x) == [] and torch.equal(ident(x), x) and ident.out_dim == 7
    torch.manual_seed(0)
    a = ProjectionHead(7, depth=2, width=4, init_scale=1.0)
    torch.manual_seed(0)
    b = ProjectionHead(7, depth=2, width=4, init_scale=0.1)
    torch.testing.assert_close(b.layers[0][0].weight, 0.1 * a.layers[0][0].weight)
    normed = ProjectionHead(7, depth=1, width=4, bn_hidden=False, l2_out=True)
    torch.testing.assert_close(normed(x).norm(dim=1), torch.ones(3))
    assert Predictor(4, width=2)(torch.randn(5, 4)).shape == (5, 4)


@pytest.mark.parametrize("kwargs, message", [
    ({"kind": "conv"}, "head type 'conv' is unknown"),
    ({"act": "relu6"}, "activation 'relu6' is unknown"),
    ({"depth": 0}, "depth must be at least 1"),
    ({"width": 0}, "dimensions must be positive"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ProjectionHead(4, **kwargs)


def test_projection_head_is_importable_from_headprobe():
    import headprobe

    assert headprobe.ProjectionHead is ProjectionHead and "ProjectionHead" in headprobe.__all__
