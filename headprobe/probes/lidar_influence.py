"""Per-image values of LiDAR for its bootstrap interval: the delta-method linearisation over images.

LiDAR (`spectrum.lidar`) is a function F(Σ_b, Σ_w) of two covariances over N images, not a mean over images, and
recomputing it on each of 2000 resamples costs 2000 eigen-decompositions of D × D matrices with N·K·D² work each
(hours for D = 1024). Its first-order expansion is a mean: each image's pseudo-value

    u_i = F + ⟨∂F/∂Σ_b, B_i − Σ_b⟩ + ⟨∂F/∂Σ_w, A_i − (Σ_w − δI)⟩,
    B_i = N/(N−1) (μ_i − μ̄)(μ_i − μ̄)ᵀ,  A_i = 1/(K−1) Σ_t (e_it − μ_i)(e_it − μ_i)ᵀ,

is F plus image i's influence, and mean(u) = F exactly (the influences sum to zero). Bootstrapping the mean of u
is the linearised bootstrap (Efron & Tibshirani 1993, §21.3): its interval is the delta-method interval, valid when
LiDAR is a smooth function of the covariances at the sample's size (simple, well separated eigenvalues help; the
error of the expansion is O(1/N)). The gradients are spectral: with Σ_b v = λ Σ_w v (vᵀ Σ_w v = 1),
∂λ_j/∂Σ_b = v_j v_jᵀ and ∂λ_j/∂Σ_w = −λ_j v_j v_jᵀ, and F = exp(−Σ p log p), p = λ/Σλ + ε.
"""

from __future__ import annotations

import torch

from headprobe.checks import check_features

from . import spectrum


def lidar_pseudo_values(views: torch.Tensor, delta: float = 1e-4, eps: float = 1e-8,
                        chunk_rows: int | None = None) -> torch.Tensor:
    """views: (N, K, D) -> (N,) float64 pseudo-values whose mean is `spectrum.lidar(views, delta, eps)`.

    The views are read a block of images at a time (`spectrum.image_blocks`: at most `chunk_rows` view rows,
    default `spectrum.CHUNK_ROWS`, converted to float64 at once): Σ_w is summed over the blocks and each image's
    within-image term computed from its own block, so beside the views only the image means (N, D) are held.
    Views that fit in one block are computed whole (one product each, as before); more blocks change the sums'
    order, to float64 round-off."""
    if views.ndim != 3 or views.shape[0] < 2 or views.shape[1] < 2:
        raise ValueError(f"views must be (N images, K views, D) with N >= 2 and K >= 2, got {tuple(views.shape)}.")
    n, k, d = views.shape
    blocks = spectrum.image_blocks(n, k, chunk_rows)

    def within(block: slice) -> torch.Tensor:
        """The block's views minus their image's mean, (B·K, D) float64, and the means (B, D)."""
        part = views[block]
        check_features("views", part.reshape(-1, d))  # each block as it is read: the views may be read by rows
        part = part.double()
        means = part.mean(dim=1)
        return (part - means[:, None]).reshape(-1, d), means

    means = torch.empty(n, d, dtype=torch.float64, device=views.device)
    sigma_w = None
    for block in blocks:
        centred, means[block] = within(block)
        sigma_w = centred.T @ centred if sigma_w is None else sigma_w + centred.T @ centred
    sigma_w = sigma_w / (n * (k - 1))
    between = means - means.mean(dim=0)
    sigma_b = between.T @ between / (n - 1)
    w_eigenvalues, w_vectors = torch.linalg.eigh(sigma_w + delta * torch.eye(d, dtype=torch.float64,
                                                                             device=views.device))
    inverse_sqrt = (w_vectors * w_eigenvalues.rsqrt()) @ w_vectors.T
    raw, u = torch.linalg.eigh(inverse_sqrt @ sigma_b @ inverse_sqrt)
    eigenvalues = raw.clamp_min(0)
    total = eigenvalues.sum()
    if total == 0:
        raise ValueError("all images have the same mean embedding (Σ_b = 0); LiDAR is undefined.")
    p = eigenvalues / total + eps
    value = torch.exp(-(p * p.log()).sum())
    share = eigenvalues / total
    # dF/dλ_j = −F/S · [(log p_j + 1) − Σ_k (λ_k/S)(log p_k + 1)]; 0 where the eigenvalue was clamped at 0.
    grad = -value / total * ((p.log() + 1) - (share * (p.log() + 1)).sum())
    grad = torch.where(raw > 0, grad, torch.zeros_like(grad))
    v = inverse_sqrt @ u  # generalised eigenvectors, Σ_w-orthonormal
    between_part = n / (n - 1) * ((between @ v).square() @ grad)
    within_part = torch.empty(n, dtype=torch.float64, device=views.device)
    for block in blocks:
        centred = within(block)[0]
        within_part[block] = ((centred @ v).square() @ (grad * eigenvalues)).reshape(-1, k).sum(1) / (k - 1)
    # Mean-centred influences: ⟨G_b, Σ_b⟩ = mean(between_part) and ⟨G_w, Σ_w − δI⟩ = mean(within_part).
    influence = (between_part - between_part.mean()) - (within_part - within_part.mean())
    return (value + influence).cpu()
