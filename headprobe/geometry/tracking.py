"""Curvature and collapse statistics of one training batch, cheap enough to take every N steps.

The paper tracks "λ_min of the loss Hessian w.r.t. the backbone output batch, by power iteration (20 steps for
λ_max, 20 on H − λ_max I)" and finds λ_min < 0 in 72/100 epochs for a Swish head started collapsed, 1/100 for a
ReLU head: "collapse is unstable only for smooth heads" (PAPER.md claim 4). `curvature_snapshot` measures the same
λ_min and λ_max by Lanczos (`hessian.lanczos`), with residuals, error bounds and the number of Hessian-vector
products, together with the collapse statistics of the head outputs.

BatchNorm is in "batch" mode by default: it normalises with the statistics of the batch, as in the training step
whose curvature is measured, and leaves its running statistics alone. The snapshot takes gradients with
`torch.autograd.grad` only, so parameters' .grad, optimiser state, BatchNorm buffers, modes and the global random
state are as they were: it can be taken inside a training loop without changing the run.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable

import torch
from torch import nn

from headprobe.geometry.effective import _loss_value
from headprobe.geometry.hessian import hvp_fn, lanczos
from headprobe.geometry.pullback import batchnorm_mode

ObjectiveFn = Callable[[torch.Tensor, torch.Tensor], object]
WRT = ("representation", "head")
_TOP_EIGENVALUES = 5


def collapse_start(module: nn.Module, scale: float = 0.1) -> nn.Module:
    """Multiply every Linear weight of `module` by `scale` in place and return it: the paper's pseudo-collapsed start
    ("projector weights ×0.1"), for a head that was built or trained already. `ProjectionHead(init_scale=0.1)` does
    the same at construction.

    >>> collapse_start(nn.Linear(2, 2, bias=False), 0.0).weight.abs().sum().item()
    0.0
    """
    if not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number, got {scale}.")
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.Linear):
                m.weight.mul_(scale)
    return module


def _output_stats(h: torch.Tensor) -> dict:
    """Collapse statistics of head outputs h: (B, out); None where a statistic is undefined (e.g. all rows equal)."""
    from headprobe.probes.spectrum import covariance_spectrum, rankme

    h = h.detach().double()
    stats: dict = {"out_std": None, "out_std_uniform": 1 / math.sqrt(h.shape[1]), "rankme": None,
                   "cov_effective_rank": None, "cov_condition_number": None, "cov_condition_scope": None,
                   "cov_numerical_rank": None, "cov_top_eigenvalues": None}
    if not torch.isfinite(h).all():
        return stats
    norms = h.norm(dim=1, keepdim=True)
    if bool((norms > 0).all()):
        stats["out_std"] = float((h / norms).std(dim=0).mean())
    try:
        stats["rankme"] = rankme(h)
        cov = covariance_spectrum(h)
    except ValueError:
        return stats
    stats.update(cov_effective_rank=cov["effective_rank"], cov_condition_number=cov["condition_number"],
                 cov_condition_scope=cov["condition_number_scope"], cov_numerical_rank=cov["numerical_rank"],
                 cov_top_eigenvalues=cov["eigenvalues"][:_TOP_EIGENVALUES])
    return stats


def _operator_scale(hvp, seed: int) -> float:
    """‖Hu‖ for a random unit vector u (the RMS eigenvalue in expectation); 1 when H = 0."""
    u = torch.randn(hvp.dim, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    norm = float(hvp((u / u.norm()).to(device=hvp.device, dtype=hvp.dtype)).norm())
    return norm if norm > 0 else 1.0


def curvature_snapshot(head: nn.Module, z1: torch.Tensor, z2: torch.Tensor, objective_fn: ObjectiveFn, k: int = 1,
                       tol: float = 1e-3, max_iter: int = 40, wrt: str = "representation",
                       predictor: nn.Module | None = None, batchnorm: str = "batch", seed: int = 0) -> dict:
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
    max_iter × dim float64 numbers of memory; a sub-batch (z1[:m], z2[:m]) makes it cheaper.

    A stop-gradient (SimSiam's) cuts the dependence of the targets on z, so the operator is the Hessian of the loss
    with the targets frozen at their current values: the blocks coupling the two views vanish. Pass the loss
    without it, `symmetric_simsiam(predictor)`, to measure the Hessian of the loss function itself.

    Returns a flat, JSON-ready dict: "wrt", "dim", "loss", "lambda_min", "lambda_max", "eigenvalues" (2k,
    ascending), "residual_min", "residual_max", "error_bound_min", "error_bound_max", "converged", "n_hvp",
    "n_iter", "residual_kind", "scale" (s), "negative_curvature" (λ_min below −√dim·eps·max|λ|, the products'
    round-off in the head's dtype), the output statistics of head(z1) ("out_std": mean std of L2-normalised
    outputs, ≈ 1/√out for spread outputs, → 0 at collapse; "out_std_uniform"; "rankme"; "cov_effective_rank",
    "cov_condition_number" with its "cov_condition_scope", "cov_numerical_rank", "cov_top_eigenvalues"),
    "batchnorm", "time_s".
    """
    start = time.perf_counter()
    if wrt not in WRT:
        raise ValueError(f"wrt={wrt!r} is unknown; use 'representation' (the batch z) or 'head' (its parameters).")
    for name, z in (("z1", z1), ("z2", z2)):
        if not isinstance(z, torch.Tensor) or z.ndim != 2 or not torch.is_floating_point(z):
            raise ValueError(f"{name} must be a floating-point batch (B, D), got "
                             f"{tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__}.")
    if z1.shape != z2.shape:
        raise ValueError(f"z1 {tuple(z1.shape)} and z2 {tuple(z2.shape)} must be two views of the same samples.")
    n = z1.shape[0]
    z1, z2 = z1.detach(), z2.detach()
    with batchnorm_mode([head, predictor], batchnorm):
        if wrt == "representation":
            hvp = hvp_fn(lambda z: _loss_value(objective_fn(head(z[:n]), head(z[n:]))), torch.cat([z1, z2]))
        else:
            hvp = hvp_fn(lambda m: _loss_value(objective_fn(m(z1), m(z2))), head)
        scale = _operator_scale(hvp, seed)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="lanczos stopped")
            # On H/s a floor of 1 is s: every eigenvalue to tol·max(s, |λ|), finer than lanczos's tol·‖H‖.
            res = lanczos(lambda v: hvp(v) / scale, hvp.dim, k=k, which="both", max_iter=min(max_iter, hvp.dim),
                          tol=tol, seed=seed, dtype=torch.float64, device=hvp.device, scale=1.0)
        values = res.eigenvalues * scale
        with torch.no_grad():
            h1 = head(z1)
    lambda_min = float(values[0])
    roundoff = math.sqrt(hvp.dim) * torch.finfo(hvp.dtype).eps * float(values.abs().max())
    return {
        "wrt": wrt,
        "dim": hvp.dim,
        "loss": float(hvp.loss),
        "lambda_min": lambda_min,
        "lambda_max": float(values[-1]),
        "eigenvalues": values.tolist(),
        "residual_min": float(res.residuals[0]) * scale,
        "residual_max": float(res.residuals[-1]) * scale,
        "error_bound_min": float(res.error_bounds[0]) * scale,
        "error_bound_max": float(res.error_bounds[-1]) * scale,
        "converged": bool(res.converged.all()),
        "n_hvp": hvp.calls,
        "n_iter": res.n_iter,
        "residual_kind": res.residual_kind,
        "scale": scale,
        "negative_curvature": lambda_min < -roundoff,
        **_output_stats(h1),
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
