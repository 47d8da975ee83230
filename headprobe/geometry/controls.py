"""Controls that isolate the head's part in λ_min at one tracked state: the same weights and batch, one thing changed.

Claim 4 is about the head (the paper): "at a (pseudo-)collapsed state a Swish/GELU head gives negative Hessian
eigenvalues; linear and ReLU heads under gradient flow do not". A negative λ_min of the training loss can also come
from the objective (SimSiam's ∇²_h L is indefinite) or from the predictor's BatchNorm. A control is kept only if it
can come out differently at a collapsed state, where the two views' outputs coincide (`head_controls`):

- "swapped_act": the head's activation swapped between piecewise-linear and smooth at the same weights (ReLU ↔
  Swish, GELU/Swish/tanh → ReLU). Rules out the activation's smoothness as the source where λ_min does not move
  with the swap. The head's BatchNorm is kept (on batch statistics, as in training), so for a BatchNorm head the
  swap moves only the activation's part: BatchNorm's own part of the head's share is `share_head_bn`
  (`gm_split.split_curvature`, `bn_share.head_bn_split`), recorded beside it.
- "head_curvature": λ_min under L = ½·mean_i ‖h_i − t_i‖² for fixed random targets t (seeded): ∇²_h L = I/B ⪰ 0,
  so the G-term is PSD and λ_min < 0 only through the head's M-term Σ_i [∇_h L]_i ∇²_z h_i; ∇_h L = (h − t)/B ≠ 0
  at collapse. It asks whether the head's own curvature at this state is strong enough to make *some* loss with
  a gradient bend down, i.e. it reads claim 3's M-term at the collapsed state (0 for linear and ReLU heads without
  BatchNorm), not whether the training loss's collapse is a saddle. Rules out "the head cannot bend the loss down
  on its own at this state".

Dropped: "no_predictor" (SimSiam's cosine on h itself). At collapse h1 = h2, so −cos(h1, h2) is at its minimum:
∇_h L = 0 (the M-term vanishes for every head) and ∇²_h L ⪰ 0, so its λ_min is ≥ 0 up to the views' spread for
any head and cannot separate anything (`tests/test_geometry_controls.py` checks it on a collapsed Swish+BN head).
The predictor's BatchNorm is ruled in or out by "lambda_min_predictor_bn_running" (`gm_split`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from headprobe.geometry.extremes import negative_beyond_bound, scaled_extremes
from headprobe.geometry.hessian import hvp_fn

PIECEWISE_LINEAR = (nn.ReLU, nn.LeakyReLU, nn.Identity)
SMOOTH = (nn.SiLU, nn.GELU, nn.Tanh, nn.Softplus, nn.ELU, nn.Sigmoid)
CONTROLS = ("swapped_act", "head_curvature")


def swapped_activation(head: nn.Module) -> tuple[nn.Module, str] | None:
    """A copy of `head` with every activation swapped, piecewise-linear → Swish (SiLU) and smooth → ReLU, and a
    label such as "ReLU→SiLU"; None when the head has no activation to swap (a linear head).

    >>> swapped, label = swapped_activation(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    >>> label, type(swapped[1]).__name__
    ('ReLU→SiLU', 'SiLU')
    """
    twin = copy.deepcopy(head)
    swaps = []
    for parent in list(twin.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, PIECEWISE_LINEAR) and not isinstance(child, nn.Identity):
                new: nn.Module = nn.SiLU()
            elif isinstance(child, SMOOTH):
                new = nn.ReLU()
            else:
                continue
            setattr(parent, name, new)
            swaps.append(f"{type(child).__name__}→{type(new).__name__}")
    return (twin, ", ".join(dict.fromkeys(swaps))) if swaps else None


def target_loss(shape: torch.Size, dtype: torch.dtype, device, seed: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """L(h) = ½·mean_i ‖h_i − t_i‖² with targets t: `shape` drawn from N(0, 1) by `seed`: convex in h (∇²_h L = I/B),
    with a gradient that does not vanish at collapse.

    >>> loss = target_loss(torch.Size([2, 3]), torch.float64, "cpu", seed=0)
    >>> torch.func.hessian(loss)(torch.zeros(2, 3, dtype=torch.float64)).reshape(6, 6).diagonal().tolist()
    [0.5, 0.5, 0.5, 0.5, 0.5, 0.5]
    """
    targets = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    targets = targets.to(device=device, dtype=dtype)

    def loss(h: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((h - targets) ** 2).sum(dim=1).mean()

    return loss


def _lambda_min(loss_of_z: Callable[[torch.Tensor], torch.Tensor], z: torch.Tensor, k: int, tol: float,
                max_iter: int, seed: int, name: str) -> dict:
    hvp = hvp_fn(loss_of_z, z)
    ext = scaled_extremes(hvp, hvp.dim, hvp.dtype, hvp.device, k, tol, max_iter, seed)
    return {f"lambda_min_{name}": float(ext["values"][0]), f"lambda_max_{name}": float(ext["values"][-1]),
            f"error_bound_min_{name}": float(ext["error_bounds"][0]), f"negative_{name}": negative_beyond_bound(ext),
            f"converged_{name}": ext["converged_min"]}


def head_controls(head: nn.Module, z: torch.Tensor, objective_fn, k: int = 1, tol: float = 1e-3, max_iter: int = 40,
                  seed: int = 0) -> dict:
    """λ_min (Lanczos, `scaled_extremes`) of the Hessian w.r.t. the stacked batch z = [z1; z2]: (2B, D) under each
    control in `CONTROLS`, at the head's current weights and in the caller's BatchNorm mode.

    objective_fn: (h1, h2) → loss (a tensor or a LossTerms), the training objective (the swap runs under it).
    Returns, per control c run, "lambda_min_c", "lambda_max_c", "error_bound_min_c", "negative_c" (λ_min below
    −max(error bound, round-off)), "converged_c"; "swapped_act" the swap made ("none" for a head without
    activation); "controls" the names run."""
    from headprobe.geometry.effective import scalar_loss

    n = z.shape[0] // 2

    def through(module: nn.Module, fn) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda x: scalar_loss(fn(module(x[:n]), module(x[n:])))

    out: dict = {}
    run = []
    swapped = swapped_activation(head)
    out["swapped_act"] = "none" if swapped is None else swapped[1]
    if swapped is not None:
        out |= _lambda_min(through(swapped[0], objective_fn), z, k, tol, max_iter, seed, "swapped_act")
        run.append("swapped_act")
    with torch.no_grad():
        h = head(z)
    targets = target_loss(h.shape, h.dtype, h.device, seed + 3)
    out |= _lambda_min(lambda x: targets(torch.cat([head(x[:n]), head(x[n:])])), z, k, tol, max_iter, seed,
                       "head_curvature")
    run.append("head_curvature")
    out["controls"] = run
    return out
