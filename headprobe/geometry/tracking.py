"""Curvature and collapse statistics of one training batch, cheap enough to take every N steps.

The paper tracks "λ_min of the loss Hessian w.r.t. the backbone output batch, by power iteration (20 steps for
λ_max, 20 on H − λ_max I)" and finds λ_min < 0 in 72/100 epochs for a Swish head started collapsed, 1/100 for a
ReLU head: "collapse is unstable only for smooth heads" (PAPER.md claim 4). `curvature_snapshot` measures the same
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
    predictor as `predictor` so its BatchNorm is in the same mode. wrt: "representation" (the Hessian w.r.t. the
    stacked batch [z1; z2], dim 2·B·D, as in the paper) or "head" (w.r.t. the head's parameters that require grad).
    Lanczos runs to residual ≤ tol·max(s, |λ|) or max_iter products (40 by default, the budget of the paper's two
    20-step power iterations), k eigenvalues from each end; the scale s = ‖Hu‖ for a random unit u (one product)
    makes tol relative, since loss Hessians w.r.t. a batch are often far below 1, where an absolute tolerance
    would accept anything. Ritz values never lie below λ_min, so a negative "lambda_min" shows negative curvature
    whatever its residual, up to the products' round-off (they run in the head's dtype: float32 round-off is
    ~1e-7·λ_max). Cost: "n_hvp" products, each about one training step of the head (a double backward), plus
    max_iter × dim float64 numbers of memory; a sub-batch (z1[:m], z2[:m]) makes it cheaper. Lanczos stops when
    both ends have converged, so a larger max_iter costs only where an end needs it; "lambda_min_converged" says
    whether λ_min itself met the tolerance (λ_max usually converges first): an unconverged λ_min is an upper bound
    on the true one, not an estimate of it.

    A stop-gradient (SimSiam's) cuts the dependence of the targets on z, so the operator is the Hessian of the loss
    with the targets frozen at their current values: the blocks coupling the two views vanish. Pass the loss
    without it, `symmetric_simsiam(predictor)`, to measure the Hessian of the loss function itself.

    split=True (wrt="representation" only) adds the split H = G + M (PAPER.md claim 3), each piece by Lanczos on
    its own products at the same tol and max_iter (`geometry.gm_split`): the loss L(h) is objective_fn with the
    predictor inside it ("gterm_predictor": "in the loss"), so the M-term is the head's curvature alone. Adds
    "lambda_min_gterm", "lambda_max_gterm", "error_bound_min_gterm" (G = J_hᵀ ∇²_h L J_h); "lambda_min_mterm",
    "lambda_max_mterm", "m_norm_ratio" (‖M‖₂/‖H‖₂ from the Ritz extremes; 0 for linear and ReLU heads without
    BatchNorm); "lambda_min_loss_h", "lambda_max_loss_h", "error_bound_min_loss_h", "dim_loss_h" (∇²_h L itself);
    "predictor_batchnorm" and, where the predictor has BatchNorm, "lambda_min_predictor_bn_running",
    "error_bound_min_predictor_bn_running", "negative_predictor_bn_running" (λ_min of H with the predictor's
    BatchNorm on running statistics, the head's still on batch statistics); booleans "negative_beyond_bound"
    (λ_min < −max(error bound, round-off)), "negative_gterm", "negative_loss_h" (the same test on each piece); the
    shares at λ_min's eigenvector v (`gm_split.curvature_shares`): "rayleigh_head" (vᵀMv), "rayleigh_objective",
    "rayleigh_predictor_bn", "rayleigh_sum", "share_head", "share_objective", "share_predictor_bn" (each / the
    sum); for a head with BatchNorm, the head's part split exactly into its activation's and its BatchNorm's
    (`bn_share.head_bn_split`): "rayleigh_head_act", "rayleigh_head_bn", "share_head_act", "share_head_bn";
    "curvature_source": "none" (H not negative beyond its bound) or the part with the most negative quotient
    ("head", "objective", "predictor_bn"), with "attribution_rule"; "split_consistency" ‖(G + M − H)u‖/‖Hu‖ for a
    random unit u; "split_converged"; "n_hvp_split" (its Hessian-vector products: its cost, next to the
    snapshot's "n_hvp").

    collapse_threshold: the run's `geometry.collapse_threshold` t; the record then says "collapsed" (out_std ≤
    t/√out, `collapse.collapse_criterion`) and "collapse_bound" (t/√out), so a point taken after the head left
    collapse is not counted as evidence about a collapsed state. controls=True adds `controls.head_controls` at
    the same state.

    Returns a flat, JSON-ready dict: "wrt", "dim", "loss", "lambda_min", "lambda_max", "eigenvalues" (2k,
    ascending), "residual_min", "residual_max", "error_bound_min", "error_bound_max", "converged", "n_hvp",
    "n_iter", "residual_kind", "scale" (s), "negative_curvature" (λ_min below −√dim·eps·max|λ|, the products'
    round-off in the head's dtype), the output statistics of head(stat_rows) ("out_std": mean std of L2-normalised
    outputs, ≈ 1/√out for spread outputs, → 0 at collapse; "out_std_uniform"; "rankme"; "cov_effective_rank",
    "cov_condition_number" with its "cov_condition_scope", "cov_numerical_rank", "cov_top_eigenvalues"),
    "batchnorm", "time_s", and with split the keys above (and "lambda_min_gterm_converged"). "lambda_min_converged",
    "lambda_max_converged" (each end on its own), "max_iter" (the cap, at most dim). stat_rows: (R, D) the
    representations whose head outputs give the output statistics (a fixed set of rows, the same at every tracked
    step, `collapse.fixed_stat_rows`; default z1), in one forward pass with BatchNorm in `batchnorm` mode;
    "stats_rows" records R (RankMe is at most min(R, out)).
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
