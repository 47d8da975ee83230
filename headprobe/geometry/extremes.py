"""Extreme eigenvalues of a symmetric operator by Lanczos, with a tolerance relative to the operator's own scale,
and the test that says whether a negative λ_min is beyond what the estimate can err: what curvature tracking
(`geometry.tracking`) and its G/M split (`geometry.gm_split`) report for each Hessian they measure.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch

from headprobe.geometry.hessian import lanczos


def scaled_extremes(op: Callable[[torch.Tensor], torch.Tensor], dim: int, dtype: torch.dtype, device, k: int,
                    tol: float, max_iter: int, seed: int, eigenvectors: bool = False) -> dict:
    """k eigenvalues from each end of the symmetric operator op: (dim,) → (dim,), by Lanczos relative to its scale.

    The scale s = ‖op u‖ for a random unit u (one product; the RMS eigenvalue in expectation, 1 when op = 0) makes
    tol relative: on op/s a floor of 1 is s, every eigenvalue to tol·max(s, |λ|), finer than lanczos's tol·‖H‖.
    Returns {"values" (2k ascending), "residuals", "error_bounds", "converged" (every value), "converged_min",
    "converged_max" (the smallest and the largest value on their own), "n_iter", "max_iter" (the cap, at most
    dim), "scale", "residual_kind", "roundoff" (√dim·eps·max|λ| in the products' dtype), "vectors" ((dim, 2k)
    float64 unit Ritz vectors with eigenvectors=True, their residuals then explicit: one product each; else None)}.

    >>> out = scaled_extremes(lambda v: torch.arange(1.0, 5.0, dtype=v.dtype) * v, 4, torch.float64, "cpu", 1,
    ...                       1e-9, 4, seed=0)
    >>> [round(float(x), 6) for x in out["values"]], out["converged_min"], out["converged_max"]
    ([1.0, 4.0], True, True)
    """
    u = torch.randn(dim, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    scale = float(op((u / u.norm()).to(device=device, dtype=dtype)).norm()) or 1.0
    cap = min(max_iter, dim)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="lanczos stopped")
        res = lanczos(lambda v: op(v) / scale, dim, k=k, which="both", max_iter=cap, tol=tol,
                      seed=seed, dtype=torch.float64, device=device, scale=1.0,
                      eigenvectors=eigenvectors)
    values = res.eigenvalues * scale
    return {"values": values, "residuals": res.residuals * scale, "error_bounds": res.error_bounds * scale,
            "converged": bool(res.converged.all()), "converged_min": bool(res.converged[0]),
            "converged_max": bool(res.converged[-1]), "n_iter": res.n_iter, "max_iter": cap, "scale": scale,
            "residual_kind": res.residual_kind, "vectors": res.eigenvectors,
            "roundoff": math.sqrt(dim) * torch.finfo(dtype).eps * float(values.abs().max())}


def negative_beyond_bound(ext: dict) -> bool:
    """λ_min below −max(its Lanczos error bound, round-off): negative curvature beyond what the estimate can err.
    ext: what `scaled_extremes` returns."""
    return float(ext["values"][0]) < -max(float(ext["error_bounds"][0]), ext["roundoff"])
