"""The PyHessian-style power-iteration baseline: 20 products for λ_max, 20 on H − λ_max·I for λ_min (the paper's
recipe), kept to compare against `hessian.lanczos` (`benchmarks/bench_hessian.py`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .hessian import HVP, counted_matvec, krylov_setup

__all__ = ["PowerIterationResult", "power_iteration"]


@dataclass
class PowerIterationResult:
    """What `power_iteration` returns: eigenvalue of H (shift added back), its unit eigenvector (dim,),
    residual ‖Hv − λv‖, products used, and whether `tol` was given and met."""

    eigenvalue: float
    eigenvector: torch.Tensor
    residual: float
    n_hvp: int
    converged: bool


def power_iteration(hvp: HVP, dim: int, iters: int = 20, shift: float | None = None, seed: int = 0,
                    tol: float | None = None, dtype: torch.dtype = torch.float64,
                    device: torch.device | str | None = None) -> PowerIterationResult:
    """Dominant eigenpair of H − shift·I by power iteration: the PyHessian baseline `lanczos` is measured against.

    PyHessian's recipe is λ_max = power_iteration(hvp, dim) -- which converges to the eigenvalue of largest |λ|,
    not the largest, when |λ_min| > λ_max -- then λ_min = power_iteration(hvp, dim, shift=λ_max). `iters` caps the
    products (the paper uses 20); with tol, stop once ‖Hv − λv‖ ≤ tol·|ρ|, ρ = vᵀ(H − shift·I)v the estimate of
    the dominant eigenvalue (the norm) of the operator iterated: tol is relative, so H and c·H (with c·shift) take
    the same steps; (H − shift·I)v = 0 stops at once, converged. The residual is free: it comes from the product
    the next step needs anyway.

    >>> a = torch.diag(torch.tensor([1.0, 2.0, 5.0], dtype=torch.float64))
    >>> round(power_iteration(lambda v: a @ v, 3, iters=200).eigenvalue, 6)
    5.0
    """
    if iters < 1:
        raise ValueError(f"iters must be at least 1, got {iters}.")
    device, gen = krylov_setup(hvp, dim, seed, dtype, device)
    matvec, count = counted_matvec(hvp, dtype, device)
    shift = 0.0 if shift is None else float(shift)
    v = torch.randn(dim, generator=gen, dtype=dtype).to(device)
    v = v / v.norm()
    converged = False
    for _ in range(iters):
        w = matvec(v) - shift * v
        rayleigh = float(torch.dot(v, w))
        residual = float((w - rayleigh * v).norm())
        norm = float(w.norm())
        # Relative to |ρ| ≈ ‖H − shift·I‖, not max(1, |λ|): that floor made tol absolute for operators below 1.
        if (tol is not None and residual <= tol * abs(rayleigh)) or norm == 0.0:
            converged = tol is not None
            break
        v = w / norm
    return PowerIterationResult(eigenvalue=rayleigh + shift, eigenvector=v, residual=residual, n_hvp=count[0],
                                converged=converged)
