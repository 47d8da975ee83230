"""Per-unit values of statistics that are not means — RankMe over training rows, the Gaussian view MI over images
with views — whose resampled means are the statistic of the reweighted units to first order (a *linearised*
bootstrap; Efron & Tibshirani 1993, §21: the jackknife/infinitesimal-jackknife view of the bootstrap). The mean
of the values is the statistic itself, so `stats.PerUnit` pairs them between taps on the shared resamples.

Why not recompute the statistic on each resample: a resample drawn with replacement holds only ~63% distinct
units, and a spectrum statistic sees duplicated rows as fewer samples. For RankMe that narrows the spectrum: on
1,347 Gaussian rows in 64 dimensions the recomputed replicates sat 0.34 below the estimate (six of their own
standard deviations), so their percentile interval missed the estimate; in 100 dimensions at 400 rows their
spread was 0.26 against a true sampling spread of 0.14, which the linearised replicates gave (0.14;
tests/test_stats.py checks both and the interval's coverage).
"""

from __future__ import annotations

import torch

from ..checks import check_features
from ..features.rows import materialise
from . import spectrum

__all__ = ["gaussian_mi_per_pair", "rankme_per_row"]


def rankme_per_row(z: torch.Tensor, eps: float = 1e-7, value: float | None = None,
                   chunk_rows: int | None = None) -> torch.Tensor:
    """z: (N, D) -> (N,) float64 values g whose mean is RankMe (`value`, default `spectrum.rankme(z, eps)`) and
    whose resampled mean Σ_i w_i g_i is RankMe of the rows reweighted by N·w, to first order.

    With zᵀz = V Λ Vᵀ (σ_k² = λ_k), row i adds P_ik = (z_i · v_k)² to σ_k², so g_i = R + N Σ_k ∂R/∂σ_k
    (P_ik − σ_k²/N) / (2σ_k), with ∂R/∂σ_k = R (Σ_j q_j log p_j − log p_k) / Σσ, R = e^H, q = σ / Σσ and p = q + ε.
    A singular value that is 0 stays 0 under every reweighting (the rows span no more), so it carries no term;
    those below 10⁻⁶ σ_max (where the D×D Gram matrix no longer resolves them) carry a negligible one and are
    left out too. The Gram matrix's eigendecomposition costs half an SVD of z at the quickstart's sizes. The rows'
    quadratic forms are taken `chunk_rows` rows at a time (default `spectrum.CHUNK_ROWS`), so no (N, D) product is
    held beside z.

    >>> z = torch.randn(200, 4, generator=torch.Generator().manual_seed(0))
    >>> from headprobe.probes.spectrum import rankme
    >>> abs(float(rankme_per_row(z).mean()) - rankme(z)) < 1e-9
    True
    """
    check_features("z", z)
    chunk_rows = spectrum.CHUNK_ROWS if chunk_rows is None else chunk_rows
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be positive but got {chunk_rows}.")
    n = z.shape[0]
    # Single precision for the two N·D² products (the Gram matrix and the rows' quadratic forms): the values only
    # set an interval's width, and their mean is made `value` exactly below. Up to `chunk_rows` rows the Gram
    # matrix is one product, as before; longer z sums the blocks' products in float64 (which resolves more of the
    # small eigenvalues than one float32 product, so the values move by that product's round-off).
    if n <= chunk_rows:
        z32 = materialise(z).detach().float()
        gram = (z32.T @ z32).double()
    else:
        gram = sum(block.T @ block for block in (z[start : start + chunk_rows].double()
                                                 for start in range(0, n, chunk_rows)))
    eigenvalues, vectors = torch.linalg.eigh(gram)
    s = eigenvalues.clamp_min(0).sqrt().flip(0)
    vectors = vectors.flip(1)
    if s.sum() == 0:
        raise ValueError("z is all zeros; its singular values define no distribution.")
    q = s / s.sum()
    p = q + eps
    if value is None:
        value = spectrum.rankme(z, eps, chunk_rows)
    keep = s > s[0] * 1e-6
    d_sigma = value * ((q * p.log()).sum() - p.log()) / s.sum()
    # Σ_k c_k P_ik = z_iᵀ (V diag(c) Vᵀ) z_i with c_k = ∂R/∂σ_k / (2σ_k); the −σ_k²/N terms are a constant,
    # removed with the mean.
    c = d_sigma[keep] / (2 * s[keep])
    form = ((vectors[:, keep] * c) @ vectors[:, keep].T).float()
    influence = torch.empty(n, dtype=torch.float64, device=z.device)
    for start in range(0, n, chunk_rows):
        rows = z[start : start + chunk_rows].detach().float()
        influence[start : start + chunk_rows] = n * ((rows @ form) * rows).sum(dim=1).double()
    return value + influence - influence.mean()


def gaussian_mi_per_pair(x: torch.Tensor, y: torch.Tensor, mi: float) -> torch.Tensor:
    """x: (N, Dx), y: (N, Dy) paired rows (the two views of each image), mi: their Gaussian MI (`information.
    gaussian_mi`, bias-corrected or not: the correction depends on N and the dimensions only) -> (N,) float64
    values whose mean is `mi` and whose resampled means are the MI of the reweighted pairs, to first order.

    The Gaussian MI is ½ (log det C_xx + log det C_yy − log det C) of the joint covariance C; row i's influence on
    it is ½ (a_iᵀ C_xx⁻¹ a_i + b_iᵀ C_yy⁻¹ b_i − u_iᵀ C⁻¹ u_i), u_i = (a_i, b_i) the centred pair.

    >>> g = torch.Generator().manual_seed(0); x = torch.randn(500, 2, generator=g)
    >>> values = gaussian_mi_per_pair(x, x + torch.randn(500, 2, generator=g), 0.7)
    >>> round(float(values.mean()), 12)
    0.7
    """
    if x.ndim != 2 or y.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y must be paired (N, D) rows, got shapes {tuple(x.shape)} and {tuple(y.shape)}.")
    u = torch.cat([x.double(), y.double()], dim=1)
    u = u - u.mean(dim=0)
    dx = x.shape[1]

    def quadratic(part: torch.Tensor) -> torch.Tensor:
        cov = part.T @ part / part.shape[0]
        factor = torch.linalg.cholesky(cov)  # fails, as gaussian_mi does, on a singular covariance
        return torch.linalg.solve_triangular(factor, part.T, upper=False).square().sum(dim=0)

    influence = 0.5 * (quadratic(u[:, :dx]) + quadratic(u[:, dx:]) - quadratic(u))
    return mi + influence - influence.mean()
