"""Curvature and collapse statistics of one training batch, cheap enough to take every N steps.

The paper tracks "λ_min of the loss Hessian w.r.t. the backbone output batch, by power iteration (20 steps for
λ_max, 20 on H − λ_max I)" and finds λ_min < 0 in 72/100 epochs for a Swish head started collapsed, 1/100 for a
ReLU head: "collapse is unstable only for smooth heads" (the paper, claim 4). `curvature_snapshot` measures the same
λ_min and λ_max by Lanczos (`geometry.extremes`), with residuals, error bounds, whether λ_min itself converged and
the number of Hessian-vector products, together with the collapse statistics of the head outputs
(`geometry.collapse`). With `split=True` it also splits H = G + M (`geometry.gm_split`), so each negative λ_min is
attributed by share to the objective, the predictor's BatchNorm or the head; `controls=True` adds the controls of
`geometry.controls` at the same state.

BatchNorm is in "batch" mode by default: it normalises with the statistics of the batch, as in the training step
whose curvature is measured, and leaves its running statistics alone. The snapshot takes gradients with
`torch.autograd.grad` only, so parameters' .grad, optimiser state, BatchNorm buffers, modes and the global random
state are as they were: it can be taken inside a training loop without changing the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from headprobe.geometry.collapse import collapse_criterion, output_statistics
from headprobe.geometry.controls import head_controls
from headprobe.geometry.effective import scalar_loss
from headprobe.geometry.extremes import scaled_extremes
from headprobe.geometry.gm_split import split_curvature
from headprobe.geometry.hessian import hvp_fn
from headprobe.geometry.pullback import batchnorm_mode

ObjectiveFn = Callable[[torch.Tensor, torch.Tensor], object]
WRT = ("representation", "head")


def curvature_snapshot(head: nn.Module, z1: torch.Tensor, z2: torch.Tensor, objective_fn: ObjectiveFn, k: int = 1,
                       tol: float = 1e-3, max_iter: int = 40, wrt: str = "representation",
                       predictor: nn.Module | None = None, batchnorm: str = "batch", seed: int = 0,
                       split: bool = False, stat_rows: torch.Tensor | None = None,
                       collapse_threshold: float | None = None, controls: bool = False) -> dict:
    """λ_min, λ_max of the loss Hessian on one batch, by Lanczos, and collapse statistics of the head outputs.

    z1, z2: (B, D) backbone representations of two views. The loss is objective_fn(head(z1), head(z2)) (a tensor
    or a LossTerms), as in the training step; for SimSiam pass a closure that applies the predictor, and the
    predictor as `predictor` so its BatchNorm is in the same mode (`batchnorm`: "batch" or "running"). wrt:
    "representation" (the Hessian w.r.t. the stacked batch [z1; z2], dim 2·B·D, as in the paper) or "head" (w.r.t.
    the head's parameters that require grad). Lanczos (`geometry.hessian.lanczos`) runs to residual ≤
    tol·max(s, |λ|) or max_iter products (40: the budget of the paper's two 20-step power iterations), k eigenvalues
    from each end, s = ‖Hu‖ for a random unit u making tol relative. Ritz values never lie below λ_min, so a negative
    "lambda_min" shows negative curvature whatever its residual, up to the products' round-off; an unconverged
    λ_min ("lambda_min_converged" false) is an upper bound, not an estimate. A stop-gradient (SimSiam's) freezes the
    targets; pass `symmetric_simsiam(predictor)` to measure the loss function itself.

    split=True adds the split H = G + M (the paper's claim 3; `geometry.gm_split`, `bn_share`), the shares of
    λ_min's eigenvector and "curvature_source"; collapse_threshold t adds "collapsed" (out_std ≤ t/√out) and
    "collapse_bound"; controls=True adds `controls.head_controls`. stat_rows: (R, D) the fixed representations
    whose head outputs give out_std, RankMe and the covariance statistics (default z1). Cost: "n_hvp" products, each
    about one training step of the head, plus max_iter × dim float64 numbers.

    Returns a flat, JSON-ready dict, one "geometry" record of metrics.jsonl; every key is listed in
    docs/reference.md ("Curvature records").
    """
    start = time.perf_counter()
    if wrt not in WRT:
        raise ValueError(f"wrt={wrt!r} is unknown; use 'representation' (the batch z) or 'head' (its parameters).")
    if (split or controls) and wrt != "representation":
        raise ValueError("split=True and controls=True measure the Hessian w.r.t. the representation (G- and "
                         "M-terms, controls); use wrt='representation' or leave both False.")
    for name, z in (("z1", z1), ("z2", z2)):
        if not isinstance(z, torch.Tensor) or z.ndim != 2 or not torch.is_floating_point(z):
            raise ValueError(f"{name} must be a floating-point batch (B, D), got "
                             f"{tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__}.")
    if z1.shape != z2.shape:
        raise ValueError(f"z1 {tuple(z1.shape)} and z2 {tuple(z2.shape)} must be two views of the same samples.")
    n = z1.shape[0]
    z1, z2 = z1.detach(), z2.detach()
    rows = z1 if stat_rows is None else stat_rows.detach()
    if rows.ndim != 2 or rows.shape[1] != z1.shape[1]:
        raise ValueError(f"stat_rows must be representations (R, {z1.shape[1]}) like z1, got {tuple(rows.shape)}.")

    def loss_of_h(h: torch.Tensor) -> torch.Tensor:
        return scalar_loss(objective_fn(h[:n], h[n:]))

    extra: dict = {}
    with batchnorm_mode([head, predictor], batchnorm):
        if wrt == "representation":
            hvp = hvp_fn(lambda z: scalar_loss(objective_fn(head(z[:n]), head(z[n:]))), torch.cat([z1, z2]))
        else:
            hvp = hvp_fn(lambda m: scalar_loss(objective_fn(m(z1), m(z2))), head)
        full = scaled_extremes(hvp, hvp.dim, hvp.dtype, hvp.device, k, tol, max_iter, seed, eigenvectors=split)
        n_hvp = hvp.calls
        if split:
            extra = split_curvature(head, loss_of_h, torch.cat([z1, z2]), hvp, full, k, tol, max_iter, seed, predictor)
        if controls:
            extra |= head_controls(head, torch.cat([z1, z2]), objective_fn, k, tol, max_iter, seed)
        with torch.no_grad():
            h1 = head(rows.to(dtype=z1.dtype))
    values = full["values"]
    lambda_min = float(values[0])
    stats = output_statistics(h1)
    if collapse_threshold is not None:
        verdict = collapse_criterion(stats["out_std"], h1.shape[1], collapse_threshold)
        extra |= {"collapsed": verdict["collapsed"], "collapse_bound": verdict["threshold"]}
    return {
        "wrt": wrt,
        "dim": hvp.dim,
        "loss": float(hvp.loss),
        "lambda_min": lambda_min,
        "lambda_max": float(values[-1]),
        "eigenvalues": values.tolist(),
        "residual_min": float(full["residuals"][0]),
        "residual_max": float(full["residuals"][-1]),
        "error_bound_min": float(full["error_bounds"][0]),
        "error_bound_max": float(full["error_bounds"][-1]),
        "converged": full["converged"],
        "lambda_min_converged": full["converged_min"],
        "lambda_max_converged": full["converged_max"],
        "max_iter": full["max_iter"],
        "n_hvp": n_hvp,
        "n_iter": full["n_iter"],
        "residual_kind": full["residual_kind"],
        "scale": full["scale"],
        "negative_curvature": lambda_min < -full["roundoff"],
        **stats,
        "stats_rows": len(rows),
        **extra,
        "batchnorm": batchnorm,
        "time_s": time.perf_counter() - start,
    }


def symmetric_simsiam(predictor: nn.Module) -> ObjectiveFn:
    """SimSiam's loss as a function of (h1, h2), without the stop-gradient: objective_fn for `curvature_snapshot`.

    L = −½ [cos(p(h1), h2) + cos(p(h2), h1)] has the value of `objectives.simsiam`; the stop-gradient changes the
    update, not the loss. With it, second derivatives treat the targets as constants and lose the blocks coupling
    the two views; without it they are the Hessian of the loss function.

    >>> loss = symmetric_simsiam(nn.Identity())(torch.ones(2, 3), torch.ones(2, 3))
    >>> round(loss.item(), 6)
    -1.0
    """
    cosine = nn.functional.cosine_similarity

    def objective(h1: torch.Tensor, h2: torch.Tensor) -> torch.Tensor:
        return -0.5 * (cosine(predictor(h1), h2, dim=1).mean() + cosine(predictor(h2), h1, dim=1).mean())

    return objective
