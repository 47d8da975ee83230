"""The objectives against the papers' formulas written out with loops, and two processes against one."""

import math
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from timeouts import HANG_TIMEOUT_S

from headprobe.registry import OBJECTIVES as REGISTERED
from headprobe.train.objectives import LossTerms, barlow_twins, gather_with_grad, info_nce, simsiam, vicreg

# The built-in objectives, read from the one registry that declares them (plug-ins of this environment left out).
OBJECTIVES = {name: REGISTERED.get(name) for name in REGISTERED.names()
              if REGISTERED.entry(name).target.startswith("headprobe.train.objectives:")}

pytestmark = pytest.mark.usefixtures("single_thread")


def views(n=10, d=4, seed=0, scale=0.6):
    """Two correlated float64 views; scale < 1 keeps most standard deviations under VICReg's γ = 1."""
    g = torch.Generator().manual_seed(seed)
    z1 = scale * torch.randn(n, d, generator=g, dtype=torch.float64)
    z2 = z1 + 0.5 * scale * torch.randn(n, d, generator=g, dtype=torch.float64)
    return z1, z2


def loop_info_nce(z1, z2, temperature):
    """SimCLR's ℓ(i, j) for every anchor, one sum at a time."""
    z = [[x / math.sqrt(sum(v * v for v in row)) for x in row] for row in torch.cat([z1, z2]).tolist()]
    m = len(z)
    total = 0.0
    for i in range(m):
        sims = [sum(a * b for a, b in zip(z[i], z[k], strict=True)) / temperature for k in range(m)]
        denominator = sum(math.exp(s) for k, s in enumerate(sims) if k != i)
        total -= math.log(math.exp(sims[(i + m // 2) % m]) / denominator)
    return total / m


def loop_vicreg_terms(z1, z2, eps, gamma):
    """(s, v(Z) + v(Z'), c(Z) + c(Z')) of the VICReg paper, s as in its Algorithm 1 (mean over N·D)."""
    a, b = z1.tolist(), z2.tolist()
    n, d = len(a), len(a[0])
    s = sum((a[i][j] - b[i][j]) ** 2 for i in range(n) for j in range(d)) / (n * d)
    v = c = 0.0
    for z in (a, b):
        mean = [sum(z[i][j] for i in range(n)) / n for j in range(d)]
        for j in range(d):
            var = sum((z[i][j] - mean[j]) ** 2 for i in range(n)) / (n - 1)
            v += max(0.0, gamma - math.sqrt(var + eps)) / d
        for p in range(d):
            for q in range(d):
                if p != q:
                    cov = sum((z[i][p] - mean[p]) * (z[i][q] - mean[q]) for i in range(n)) / (n - 1)
                    c += cov**2 / d
    return s, v, c


def loop_barlow_terms(z1, z2):
    """(Σ (1 − C_ii)², Σ_{i≠j} C_ij²) with C_ij from Eq. 2 of Barlow Twins on mean-centred outputs."""
    a, b = (z - z.mean(dim=0) for z in (z1, z2))
    a, b = a.tolist(), b.tolist()
    n, d = len(a), len(a[0])
    on = off = 0.0
    for i in range(d):
        for j in range(d):
            num = sum(a[k][i] * b[k][j] for k in range(n))
            c = num / (math.sqrt(sum(a[k][i] ** 2 for k in range(n))) * math.sqrt(sum(b[k][j] ** 2 for k in range(n))))
            if i == j:
                on += (1 - c) ** 2
            else:
                off += c**2
    return on, off


def loop_simsiam(p1, p2, z1, z2):
    def cos(u, v):
        return sum(x * y for x, y in zip(u, v, strict=True)) / math.sqrt(sum(x * x for x in u) * sum(y * y for y in v))

    rows = range(len(p1))
    p1, p2, z1, z2 = p1.tolist(), p2.tolist(), z1.tolist(), z2.tolist()
    return -0.5 * (sum(cos(p1[i], z2[i]) for i in rows) + sum(cos(p2[i], z1[i]) for i in rows)) / len(rows)


@pytest.mark.parametrize("temperature", [0.1, 0.5])
def test_info_nce_equals_loops(temperature):
    z1, z2 = views()
    out = info_nce(z1, z2, temperature=temperature)
    assert out.loss.dtype == torch.float64
    assert out.loss.item() == pytest.approx(loop_info_nce(z1, z2, temperature), abs=1e-10)
    assert out.terms == {"info_nce": out.loss.item()}


def test_vicreg_equals_loops():
    z1, z2 = views()
    s, v, c = loop_vicreg_terms(z1, z2, eps=1e-4, gamma=1.0)
    assert min(s, v, c) > 0.01  # every term is exercised
    out = vicreg(z1, z2, sim_weight=3.0, var_weight=5.0, cov_weight=7.0, variance="paper")
    assert out.terms["vicreg.sim"] == pytest.approx(s, abs=1e-10)
    assert out.terms["vicreg.var"] == pytest.approx(v, abs=1e-10)
    assert out.terms["vicreg.cov"] == pytest.approx(c, abs=1e-10)
    assert out.loss.item() == pytest.approx(3 * s + 5 * v + 7 * c, abs=1e-10)
    assert out.terms["vicreg"] == out.loss.item()
    official = vicreg(z1, z2, sim_weight=3.0, var_weight=5.0, cov_weight=7.0)
    assert official.terms["vicreg.var"] == pytest.approx(v / 2, abs=1e-10)
    assert official.loss.item() == pytest.approx(3 * s + 5 * v / 2 + 7 * c, abs=1e-10)


def official_vicreg_numpy(x, y, sim_coeff=25.0, std_coeff=25.0, cov_coeff=1.0):
    """facebookresearch/vicreg main_vicreg.py `VICReg.forward` after the projector, transcribed to NumPy, with
    its gradient w.r.t. x and y written out by hand (so the test does not lean on autograd)."""
    import numpy as np

    n, d = x.shape
    repr_loss = ((x - y) ** 2).mean()
    grads = [2 * sim_coeff * (x - y) / (n * d), -2 * sim_coeff * (x - y) / (n * d)]
    std_loss = cov_loss = 0.0
    for k, z in enumerate((x, y)):
        zc = z - z.mean(axis=0)
        std = np.sqrt(zc.var(axis=0, ddof=1) + 0.0001)
        std_loss += np.mean(np.maximum(0.0, 1 - std)) / 2
        cov = zc.T @ zc / (n - 1)
        off = cov - np.diag(np.diag(cov))
        cov_loss += (off**2).sum() / d
        # d std_j / d z_ij = zc_ij / ((n - 1) std_j); the mean over rows of that is 0, so centring drops out.
        grads[k] += std_coeff * (-(std < 1).astype(float) / (2 * d)) * zc / ((n - 1) * std)
        grads[k] += cov_coeff * 4 * zc @ off / ((n - 1) * d)
    loss = sim_coeff * repr_loss + std_coeff * std_loss + cov_coeff * cov_loss
    return loss, grads


def test_vicreg_default_is_the_official_code_in_value_and_gradient():
    z1, z2 = views(n=16, d=6, seed=3)
    x, y = z1.clone().requires_grad_(), z2.clone().requires_grad_()
    out = vicreg(x, y)
    out.loss.backward()
    loss, (gx, gy) = official_vicreg_numpy(z1.numpy(), z2.numpy())
    assert out.loss.item() == pytest.approx(loss, rel=1e-12)
    assert torch.allclose(x.grad, torch.from_numpy(gx), rtol=1e-10, atol=1e-13)
    assert torch.allclose(y.grad, torch.from_numpy(gy), rtol=1e-10, atol=1e-13)
    # The printed Eq. 6 weighs the hinge twice: the paper form differs by exactly μ·(v(Z) + v(Z'))/2.
    paper = vicreg(z1, z2, variance="paper")
    assert paper.loss.item() - out.loss.item() == pytest.approx(25 * out.terms["vicreg.var"], rel=1e-12)
    assert out.terms["vicreg.var"] > 0.05


def test_objective_protocol_records_the_vicreg_convention():
    from headprobe.train.objectives import objective_protocol

    assert objective_protocol("vicreg", {})["variance"] == "official"
    assert objective_protocol("vicreg", {"variance": "paper", "sim_weight": 10.0}) == {
        "sim_weight": 10.0, "var_weight": 25.0, "cov_weight": 1.0, "eps": 1e-4, "gamma": 1.0, "variance": "paper"}


def test_barlow_twins_equals_loops():
    z1, z2 = views()
    on, off = loop_barlow_terms(z1, z2)
    out = barlow_twins(z1, z2, lambd=0.3)
    assert out.terms["barlow_twins.on_diag"] == pytest.approx(on, abs=1e-10)
    assert out.terms["barlow_twins.off_diag"] == pytest.approx(off, abs=1e-10)
    assert out.loss.item() == pytest.approx(on + 0.3 * off, abs=1e-10)


def test_simsiam_equals_loops():
    p1, p2 = views(seed=1)
    z1, z2 = views(seed=2)
    assert simsiam(p1, p2, z1, z2).loss.item() == pytest.approx(loop_simsiam(p1, p2, z1, z2), abs=1e-10)


def call(name, z1, z2):
    if name == "simsiam":
        return OBJECTIVES[name](z1, z2, z1, z2)
    return OBJECTIVES[name](z1, z2)


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_permuting_the_batch_keeps_the_loss_but_breaking_the_pairs_does_not(name):
    z1, z2 = views()
    perm = torch.randperm(len(z1), generator=torch.Generator().manual_seed(3))
    loss = call(name, z1, z2).loss.item()
    assert call(name, z1[perm], z2[perm]).loss.item() == pytest.approx(loss, abs=1e-12)
    assert abs(call(name, z1, z2[perm]).loss.item() - loss) > 1e-3


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_every_objective_returns_loss_terms_with_its_total(name):
    out = call(name, *views())
    assert isinstance(out, LossTerms)
    assert out.loss.ndim == 0
    assert out.terms[name] == out.loss.item()
    assert all(key == name or key.startswith(f"{name}.") for key in out.terms)


def test_info_nce_of_orthogonal_identical_views_is_its_closed_form():
    # Positive similarity 1, all 2N − 2 negatives 0: ℓ = log(1 + (2N − 2)·e^(−1/τ)) → 0 as τ → 0.
    z = torch.eye(6, dtype=torch.float64)[:5] * 3.0
    losses = [info_nce(z, z, temperature=t).loss.item() for t in (1.0, 0.2, 0.05)]
    assert losses == pytest.approx([math.log1p(8 * math.exp(-1 / t)) for t in (1.0, 0.2, 0.05)], abs=1e-12)
    assert losses[-1] < 1e-7


def test_vicreg_of_decorrelated_identical_views_is_the_variance_hinge_alone():
    # Centred, orthogonal ±s columns: s = 0 (same views), c = 0, unbiased Var = 4s²/3 per column.
    h = torch.tensor([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]], dtype=torch.float64)
    assert vicreg(2 * h, 2 * h).loss.item() == pytest.approx(0.0, abs=1e-12)
    out = vicreg(0.5 * h, 0.5 * h, eps=1e-4)
    assert out.terms["vicreg.sim"] == 0.0
    assert out.terms["vicreg.cov"] == pytest.approx(0.0, abs=1e-12)
    assert out.terms["vicreg.var"] == pytest.approx(1 - math.sqrt(1 / 3 + 1e-4), abs=1e-12)


def test_barlow_twins_standardises_each_dimension_over_the_batch():
    z1, z2 = views()
    same = barlow_twins(z1, z1)
    assert same.terms["barlow_twins.on_diag"] == pytest.approx(0.0, abs=1e-12)
    rescaled = z1 * torch.tensor([0.1, 2.0, 5.0, 30.0], dtype=torch.float64) + 7.0
    assert barlow_twins(rescaled, z2).loss.item() == pytest.approx(barlow_twins(z1, z2).loss.item(), abs=1e-10)


def test_simsiam_stops_the_gradient_into_the_projections():
    p1, p2 = (t.requires_grad_() for t in views(seed=1))
    z1, z2 = (t.requires_grad_() for t in views(seed=2))
    simsiam(p1, p2, z1, z2).loss.backward()
    assert z1.grad is None and z2.grad is None
    assert p1.grad.abs().sum() > 0 and p2.grad.abs().sum() > 0


def test_gather_with_grad_is_the_identity_in_one_process():
    x = torch.ones(3, 2)
    assert gather_with_grad(x) is x


@pytest.mark.parametrize(
    ("call_it", "message"),
    [
        (lambda: info_nce(torch.ones(4, 3), torch.ones(4, 2)), "shapes"),
        (lambda: info_nce(torch.ones(4), torch.ones(4)), "2-D"),
        (lambda: info_nce(torch.ones(4, 3), torch.ones(4, 3), temperature=0.0), "temperature"),
        (lambda: vicreg(torch.ones(1, 3), torch.ones(1, 3)), "at least 2 samples"),
        (lambda: vicreg(torch.ones(4, 3), torch.ones(4, 3), var_weight=-1.0), "var_weight"),
        (lambda: vicreg(torch.ones(4, 3), torch.ones(4, 3), variance="halved"), "official"),
        (lambda: barlow_twins(torch.ones(4, 3, dtype=torch.long), torch.ones(4, 3)), "dtype"),
        (lambda: simsiam(torch.ones(4, 3), torch.ones(4, 3), torch.ones(4, 2), torch.ones(4, 2)), "shapes"),
    ],
)
def test_bad_arguments_raise_a_sentence(call_it, message):
    with pytest.raises(ValueError, match=message):
        call_it()


DISTRIBUTED_SCRIPT = """
import sys

import torch
import torch.distributed as dist

from headprobe.registry import OBJECTIVES as REGISTERED

OBJECTIVES = {name: REGISTERED.get(name) for name in REGISTERED.names()
              if REGISTERED.entry(name).target.startswith("headprobe.train.objectives:")}


def results(rank, world):
    '''Loss, DDP-averaged parameter gradients and input gradients of every objective on rank's rows.'''
    g = torch.Generator().manual_seed(0)
    n, d_in, d = 8, 6, 5
    x1, x2 = (torch.randn(n, d_in, generator=g, dtype=torch.float64) for _ in range(2))
    projector = torch.nn.Linear(d_in, d, dtype=torch.float64)
    predictor = torch.nn.Linear(d, d, dtype=torch.float64)
    with torch.no_grad():
        for p in [*projector.parameters(), *predictor.parameters()]:
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    params = [*projector.parameters(), *predictor.parameters()]
    rows = slice(rank * n // world, (rank + 1) * n // world)
    out = {}
    for name, objective in OBJECTIVES.items():
        for p in params:
            p.grad = None
        a, b = x1[rows].clone().requires_grad_(), x2[rows].clone().requires_grad_()
        z1, z2 = projector(a), projector(b)
        loss = objective(*((predictor(z1), predictor(z2), z1, z2) if name == "simsiam" else (z1, z2)),
                         gather_distributed=True).loss
        loss.backward()
        grads = torch.cat([torch.zeros_like(p).flatten() if p.grad is None else p.grad.flatten() for p in params])
        inputs = torch.cat([a.grad, b.grad], dim=1)
        losses = loss.detach().reshape(1)
        if world > 1:
            dist.all_reduce(grads)
            grads /= world  # what DDP does to every parameter gradient
            parts = [torch.empty_like(inputs) for _ in range(world)]
            dist.all_gather(parts, inputs)
            inputs = torch.cat(parts)
            parts = [torch.empty_like(losses) for _ in range(world)]
            dist.all_gather(parts, losses)
            losses = torch.cat(parts)
        out[name] = {"losses": losses, "params": grads, "inputs": inputs}
    return out


if __name__ == "__main__":
    dist.init_process_group("gloo")
    out = results(dist.get_rank(), dist.get_world_size())
    if dist.get_rank() == 0:
        torch.save(out, sys.argv[1])
    dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="torchrun missing")
def test_two_processes_equal_one_global_batch(tmp_path):
    script = tmp_path / "objectives_job.py"
    script.write_text(DISTRIBUTED_SCRIPT)
    torchrun = str(Path(sys.executable).parent / "torchrun")
    done = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", str(script), str(tmp_path / "two.pt")],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=HANG_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    two = torch.load(tmp_path / "two.pt")
    one = runpy.run_path(str(script))["results"](0, 1)
    for name in OBJECTIVES:
        (loss,) = one[name]["losses"]
        losses = two[name]["losses"]
        assert losses.mean().item() == pytest.approx(loss.item(), abs=1e-10), name
        if name in ("vicreg", "barlow_twins"):
            torch.testing.assert_close(losses, loss.expand(2), atol=1e-10, rtol=0, msg=name)
        torch.testing.assert_close(two[name]["params"], one[name]["params"], atol=1e-10, rtol=0, msg=name)
        # Each rank's inputs get world_size × their one-process gradient, as under DDP with any mean loss.
        torch.testing.assert_close(two[name]["inputs"], 2 * one[name]["inputs"], atol=1e-10, rtol=0, msg=name)


def test_objectives_are_declared_once_in_the_registry():
    """The registry is the one list of objectives: every loss function of train/objectives.py is registered under
    its own name, and the module keeps no second name → function table."""
    import inspect

    import headprobe.train.objectives as module

    losses = {name for name, f in vars(module).items()
              if inspect.isfunction(f) and f.__module__ == module.__name__
              and inspect.signature(f).return_annotation in (LossTerms, "LossTerms")}
    assert losses == set(OBJECTIVES) == {"info_nce", "vicreg", "barlow_twins", "simsiam"}
    assert not [name for name, value in vars(module).items() if isinstance(value, dict) and set(value) & losses]
