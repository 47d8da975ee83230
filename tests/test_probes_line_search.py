import importlib

import pytest
import torch

from headprobe.probes.line_search import strong_wolfe

# The original, while torch keeps it (a private name, so it may go in any release).
torch_strong_wolfe = getattr(importlib.import_module("torch.optim.lbfgs"), "_strong_wolfe", None)


def rosenbrock(x: torch.Tensor) -> tuple[float, torch.Tensor]:
    x = x.detach().requires_grad_()
    loss = (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()
    (grad,) = torch.autograd.grad(loss, x)
    return float(loss.detach()), grad


def recorded(search, x, t, d, **options):
    """The trial steps the search evaluates, and what it returns."""
    trials = []

    def along(start, step, direction):
        trials.append(float(step))
        return rosenbrock(start + step * direction)

    loss, grad = rosenbrock(x)
    return trials, search(along, x, t, d, loss, grad, grad.dot(d), **options)


CASES = [
    (1.0, {}),  # overshoots: bracket at once, then zoom
    (1e-6, {"c2": 0.01}),  # far too short: extrapolation (x5.5 per trial) until the bracket, then zoom
    (3.0, {"max_ls": 2}),  # runs out of evaluations mid-zoom
    (1.0, {"c2": 0.1}),  # a tighter curvature condition: a longer zoom
    (1e-3, {"c2": 0.01, "tolerance_change": 1e-2}),  # stopped by the bracket's width
]


@pytest.mark.skipif(torch_strong_wolfe is None, reason="the installed torch no longer has the original")
@pytest.mark.parametrize(("t", "options"), CASES)
def test_strong_wolfe_takes_torchs_steps(t, options):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, generator=g, dtype=torch.float64)
    d = -rosenbrock(x)[1]
    ours, (loss, grad, step, evaluations) = recorded(strong_wolfe, x, t, d, **options)
    theirs, (torch_loss, torch_grad, torch_step, torch_evaluations) = recorded(torch_strong_wolfe, x, t, d, **options)
    assert len(ours) > 1 and ours == theirs
    assert (loss, float(step), evaluations) == (torch_loss, float(torch_step), torch_evaluations)
    assert torch.equal(grad, torch_grad)


def test_strong_wolfe_meets_the_wolfe_conditions_on_rosenbrock():
    x = torch.tensor([-1.2, 1.0, -1.2, 1.0], dtype=torch.float64)
    f, g = rosenbrock(x)
    d = -g
    loss, grad, step, evaluations = strong_wolfe(lambda s, t, d: rosenbrock(s + t * d), x, 1.0, d, f, g, g.dot(d))
    assert float(rosenbrock(x + step * d)[0]) == loss
    assert loss <= f + 1e-4 * step * float(g.dot(d))  # sufficient decrease
    assert abs(float(grad.dot(d))) <= 0.9 * abs(float(g.dot(d)))  # strong curvature condition
    assert 1 < evaluations <= 25
