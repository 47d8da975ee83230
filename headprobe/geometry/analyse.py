"""Per-head geometry at the end of a run: the paper's objects evaluated on the trained head.

Everything is computed on a float64 copy of the head (BatchNorm on running statistics for the
per-sample quantities), on small batches, with the estimator, its iteration count and residual
recorded next to each number.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import torch

from .density import slq_density, smoothed_density
from .effective import effective_hessian
from .hessian import hvp_fn
from .pullback import augmentation_degeneracy, pullback_metric
from .tracking import curvature_snapshot


def objective_closure(objective, options: dict, predictor=None):
    """(h1, h2) → LossTerms, applying the predictor first when there is one (SimSiam)."""
    if predictor is None:
        return lambda h1, h2: objective(h1, h2, **options)
    return lambda h1, h2: objective(predictor(h1), predictor(h2), h1, h2, **options)


def _summary(d: dict, drop: tuple[str, ...] = ()) -> dict:
    out = {}
    for key, value in d.items():
        if key in drop:
            continue
        if isinstance(value, torch.Tensor):
            value = value.tolist() if value.numel() <= 64 else value[:64].tolist()
        out[key] = value
    return out


PARTS = ("pull-back metric", "augmentation gains", "effective Hessian", "curvature", "Hessian density")
CURVATURE_ROWS, CURVATURE_MAX_ITER = 64, 60


def effective_batch(dim: int) -> int:
    """The rows of the dense effective Hessian, which is (2·B·D)²: B·D kept near 1,500."""
    return max(2, min(8, 1500 // dim))


def size_estimate(head, dim: int, n: int, views: int, rows: int, density_vectors: int = 4,
                  density_steps: int = 40) -> str:
    """What `analyse_head` will compute for one head, said before it starts (its time depends on these sizes):
    the pull-back Jacobians, the dense effective Hessian, and the Hessian-vector products of Lanczos and SLQ."""
    out = getattr(head, "out_dim", dim)
    r, b = min(rows, n), effective_batch(dim)
    side = 2 * b * dim
    return (f"{r} rows of {dim} → {out}: pull-back Jacobians {r} × {out} × {dim} ({r * out * dim * 8 / 2**20:,.0f} MiB "
            f"in float64) and {views}-view augmentation gains; a dense effective Hessian of side {side:,} "
            f"({side * side * 8 / 2**20:,.0f} MiB); up to {CURVATURE_MAX_ITER} + {density_vectors * density_steps} "
            f"Hessian-vector products on {2 * min(CURVATURE_ROWS, r)} rows")


def analyse_head(head, predictor, objective, options: dict, features: torch.Tensor, views: torch.Tensor,
                 *, rows: int = 256, seed: int = 0, density_vectors: int = 4, density_steps: int = 40,
                 on_part: Callable[[str], None] | None = None) -> dict:
    """features: (N, D) clean training features; views: (N, K, D) cached view features → geometry dict.

    Keys: "pullback" (spectrum of G = JᵀJ, rank, conditioning on its support, variation across samples),
    "augmentation" (gain of J along augmentation tangents vs random directions), "effective_hessian"
    (G- and M-terms on a tiny batch, ‖M‖/‖H‖, whitening of the top-r subspace), "curvature" (λ_min/λ_max
    of the loss Hessian w.r.t. the representation batch, Lanczos with residuals), "hessian_density" (SLQ).
    `on_part(name)` is called as each of `PARTS` finishes (a progress display).
    """
    def done(part: str) -> None:
        if on_part is not None:
            on_part(part)

    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(seed)
    n, k, d = views.shape
    idx = torch.randperm(n, generator=g)[: min(rows, n)]
    h64 = copy.deepcopy(head).double().eval()
    p64 = copy.deepcopy(predictor).double().eval() if predictor is not None else None
    fn = objective_closure(objective, options, p64)
    out: dict = {}
    out["pullback"] = _summary(pullback_metric(h64, features[idx].double()), drop=("eigenvalues_std",))
    out["pullback_spectrum"] = out["pullback"].get("eigenvalues", [])
    done(PARTS[0])
    out["augmentation"] = _summary(augmentation_degeneracy(h64, views[idx, 0].double(), z_views=views[idx].double()))
    done(PARTS[1])
    b = effective_batch(d)
    za, zb = views[idx[:b], 0].double(), views[idx[:b], 1].double()
    eff = effective_hessian(h64, torch.cat([za, zb]), lambda h: fn(h[:b], h[b:]))
    out["effective_hessian"] = _summary(eff, drop=("eigenvalues_H", "eigenvalues_G", "eigenvalues_M"))
    out["effective_hessian"]["batch"] = b
    done(PARTS[2])
    z1, z2 = views[idx[:CURVATURE_ROWS], 0].double(), views[idx[:CURVATURE_ROWS], 1].double()
    out["curvature"] = _summary(curvature_snapshot(h64, z1, z2, fn, predictor=p64, max_iter=CURVATURE_MAX_ITER,
                                                   seed=seed), drop=("cov_top_eigenvalues",))
    done(PARTS[3])
    with torch.enable_grad():
        stacked = torch.cat([z1, z2]).requires_grad_(False)

        def loss(z: torch.Tensor) -> torch.Tensor:
            terms = fn(h64(z[: len(z1)]), h64(z[len(z1):]))
            return getattr(terms, "loss", terms)

        hvp = hvp_fn(loss, stacked)
        nodes, weights = slq_density(hvp, hvp.dim, n_vectors=density_vectors, n_steps=density_steps, seed=seed)
    span = float(nodes.max() - nodes.min()) or 1.0
    grid = torch.linspace(float(nodes.min()) - 0.05 * span, float(nodes.max()) + 0.05 * span, 200)
    density = smoothed_density(nodes, weights, grid, sigma=span / 100)
    out["hessian_density"] = {"grid": grid.tolist(), "density": density.tolist(), "estimator": "SLQ",
                              "n_vectors": density_vectors, "n_steps": density_steps, "n_hvp": hvp.calls,
                              "wrt": "representation batch [z1; z2]", "batch": len(z1)}
    out["time_s"] = time.perf_counter() - t0
    done(PARTS[4])
    return out
