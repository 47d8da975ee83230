"""Stochastic estimates of a Hessian's trace and spectral density from Hessian-vector products: Hutchinson's
trace estimator and stochastic Lanczos quadrature (SLQ), on the operators of `headprobe.geometry.hessian`."""

from __future__ import annotations

import math

import numpy as np
import torch

from headprobe.geometry.hessian import HVP, counted_matvec, krylov_setup, lanczos_ritz_pairs, rademacher


def hutchinson_trace(hvp: HVP, dim: int, n_samples: int = 100, seed: int = 0, dtype: torch.dtype = torch.float64,
                     device: torch.device | str | None = None) -> tuple[float, float]:
    """tr(H) ≈ mean of uᵀHu over Rademacher u (Hutchinson 1989); returns (estimate, standard error).

    >>> a = torch.diag(torch.arange(1.0, 5.0, dtype=torch.float64))
    >>> hutchinson_trace(lambda v: a @ v, 4, n_samples=10)
    (10.0, 0.0)
    """
    if n_samples < 2:
        raise ValueError(f"n_samples must be at least 2 to give a standard error, got {n_samples}.")
    device, gen = krylov_setup(hvp, dim, seed, dtype, device)
    matvec, _ = counted_matvec(hvp, dtype, device)
    samples = []
    for _ in range(n_samples):
        u = rademacher(dim, gen, dtype, device)
        samples.append(float(torch.dot(u, matvec(u))))
    values = np.array(samples)
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(n_samples))


def slq_density(hvp: HVP, dim: int, n_vectors: int = 10, n_steps: int = 80, seed: int = 0,
                dtype: torch.dtype = torch.float64, device: torch.device | str | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Spectral density by stochastic Lanczos quadrature (Ghorbani et al. 2019); returns (nodes, weights).

    "we approximate φ(t) by ... Σ_l Σ_i τ_i^l g(t; θ_i^l)", with θ the Ritz values of n_steps Lanczos steps from
    each of n_vectors random unit vectors and τ the squared first components of T's eigenvectors. nodes, weights:
    (N,) with N ≤ n_vectors·n_steps; the weights sum to 1, so Σ w θ^p ≈ tr(H^p)/dim (exact per vector for
    p < 2·n_steps). Smooth them with `smoothed_density`. Products used: at most n_vectors·n_steps.
    """
    if n_vectors < 1 or n_steps < 1:
        raise ValueError(f"slq_density needs n_vectors >= 1 and n_steps >= 1, got {n_vectors} and {n_steps}.")
    device, gen = krylov_setup(hvp, dim, seed, dtype, device)
    matvec, _ = counted_matvec(hvp, dtype, device)
    nodes, weights = [], []
    for _ in range(n_vectors):
        # SLQ takes all n_steps unless the space becomes invariant, so the basis is allocated at once.
        theta, s = lanczos_ritz_pairs(matvec, rademacher(dim, gen, dtype, device), min(n_steps, dim))
        nodes.append(theta)
        weights.append(s[0] ** 2 / n_vectors)
    return torch.as_tensor(np.concatenate(nodes)), torch.as_tensor(np.concatenate(weights))


def smoothed_density(nodes: torch.Tensor, weights: torch.Tensor, grid: torch.Tensor, sigma: float) -> torch.Tensor:
    """Σ_j w_j N(t; θ_j, σ²) at each grid point t: grid (G,) -> (G,); integrates to Σ w = 1 over a wide grid."""
    if sigma <= 0:
        raise ValueError(f"sigma must be positive, got {sigma}; it is the width of the Gaussian kernel.")
    diff = (grid.to(torch.float64)[:, None] - nodes.to(torch.float64)[None, :]) / sigma
    return (torch.exp(-0.5 * diff**2) @ weights.to(torch.float64)) / (sigma * math.sqrt(2 * math.pi))
