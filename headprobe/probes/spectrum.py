"""Label-free measures of a representation's geometry: effective ranks (RankMe, LiDAR), the covariance
eigenspectrum's decay (α-ReQ) and conditioning (alignment, uniformity and view spread: `probes/view_geometry.py`).

All take features as tensors or taps read by rows (`features.rows.TapRows`: read a block of rows at a time),
compute in float64 on the features' device, and return Python floats (or, for `covariance_spectrum`, a JSON-ready
dict).
"""

from __future__ import annotations

import math

import torch

from headprobe.checks import check_features
from headprobe.features.rows import materialise

__all__ = [
    "CHUNK_ROWS",
    "alpha_req",
    "alpha_req_fit_range",
    "covariance_eigenvalues",
    "covariance_spectrum",
    "image_blocks",
    "lidar",
    "principal_axes",
    "rankme",
    "singular_values",
]

# Below this many samples per dimension the smallest sample eigenvalues are visibly biased low.
_SAMPLES_PER_DIM = 10
# Rows of a tap converted to float64 at once by `singular_values` (and `influence.rankme_per_row`): taps up to this
# many rows are decomposed whole, as before; longer ones block by block, with extra memory ~2·(CHUNK_ROWS + D)·D
# float64 values (200 MiB at D = 768) instead of three float64 copies of the tap (18 GiB at 1M × 768). The stacked
# QR re-factors the D rows of R with each block, D / CHUNK_ROWS more work (5% at D = 768).
CHUNK_ROWS = 16_384


def image_blocks(n: int, k: int, chunk_rows: int | None = None) -> list[slice]:
    """Consecutive blocks of N images with K views each, at most `chunk_rows` view rows (default `CHUNK_ROWS`) per
    block where two images fit, and at least 2 images per block (the views' checks need two), the last one longer
    rather than a lone image. One block when all the views fit."""
    chunk_rows = CHUNK_ROWS if chunk_rows is None else chunk_rows
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be positive but got {chunk_rows}.")
    images = max(2, chunk_rows // k)
    bounds = list(range(0, n, images)) + [n]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] < 2:
        del bounds[-2]
    return [slice(start, end) for start, end in zip(bounds, bounds[1:], strict=False)]


def _exp_entropy(values: torch.Tensor, eps: float) -> float:
    """exp(−Σ p_k log p_k) with p = values / ‖values‖₁ + eps, the smoothing RankMe and LiDAR both use."""
    p = values / values.sum() + eps
    return math.exp(-float((p * p.log()).sum()))


def singular_values(z: torch.Tensor, centre: bool = False, chunk_rows: int | None = None) -> torch.Tensor:
    """z: (N, D) -> the min(N, D) singular values of z in float64, descending; with `centre`, of z minus its column
    mean. At most `chunk_rows` rows of z (default: `CHUNK_ROWS`, read at the call) are converted to float64 at once.

    A z of at most `chunk_rows` rows is decomposed whole. A longer one by a stacked QR (TSQR): R ← the R factor of
    [R; next block] (the block centred by the mean of a first pass over z), whose singular values are z's, and then
    those of the final R (min(N, D) × D). Householder QR is backward stable, so the values agree with the whole
    decomposition's to float64 round-off (relative to σ_1), small ones included, which the eigenvalues of a
    formed D × D covariance would not: they lose everything below ~1e-8·σ_1.

    >>> z = torch.randn(50, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> bool(torch.allclose(singular_values(z, chunk_rows=7), torch.linalg.svdvals(z), rtol=1e-12))
    True
    """
    chunk_rows = CHUNK_ROWS if chunk_rows is None else chunk_rows
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be positive but got {chunk_rows}.")
    n = z.shape[0]
    if n <= chunk_rows:
        z = materialise(z).double()
        return torch.linalg.svdvals(z - z.mean(dim=0) if centre else z)
    mean = None
    if centre:
        total = torch.zeros(z.shape[1], dtype=torch.float64, device=z.device)
        for start in range(0, n, chunk_rows):
            total += z[start : start + chunk_rows].double().sum(dim=0)
        mean = total / n
    blocks = (z[start : start + chunk_rows].double() for start in range(0, n, chunk_rows))
    return torch.linalg.svdvals(_stacked_r(blocks if mean is None else (block - mean for block in blocks)))


def _stacked_r(blocks) -> torch.Tensor:
    """The R factor of the rows of `blocks` stacked (float64, min(N, D) × D), one block at a time (TSQR)."""
    r = None
    for block in blocks:
        r = torch.linalg.qr(block if r is None else torch.cat([r, block]), mode="r").R
    return r


def principal_axes(parts: list[torch.Tensor], chunk_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """parts: (N_i, D) tensors pooled as rows -> (their column mean (D,), the right singular vectors Vh (min(N, D),
    D) of the pooled rows minus it, by descending singular value), in float64, at most `chunk_rows` rows (default
    `CHUNK_ROWS`) converted at once. Pooled rows that fit in one block are decomposed whole (one SVD, as before);
    more by the stacked QR of `singular_values` and the SVD of its R, whose right singular vectors are the pooled
    rows' to float64 round-off, up to each vector's sign."""
    chunk_rows = CHUNK_ROWS if chunk_rows is None else chunk_rows
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be positive but got {chunk_rows}.")
    n = sum(len(part) for part in parts)
    if n <= chunk_rows:
        pooled = torch.cat([materialise(part).double() for part in parts])
        mean = pooled.mean(dim=0)
        return mean, torch.linalg.svd(pooled - mean, full_matrices=False).Vh
    starts = [(part, start) for part in parts for start in range(0, len(part), chunk_rows)]
    mean = sum(part[start : start + chunk_rows].double().sum(dim=0) for part, start in starts) / n
    r = _stacked_r(part[start : start + chunk_rows].double() - mean for part, start in starts)
    return mean, torch.linalg.svd(r, full_matrices=False).Vh


def covariance_eigenvalues(z: torch.Tensor, chunk_rows: int | None = None) -> torch.Tensor:
    """z: (N, D) -> the min(N, D) largest eigenvalues of the unbiased sample covariance, descending (from the
    singular values of the centred float64 z, `singular_values`, not the eigenvalues of a formed covariance, which
    lose the small ones; `chunk_rows` rows at a time). `alpha_req_fit_range`, `alpha_req` and `covariance_spectrum`
    take them as `eigenvalues=` to share one decomposition."""
    return singular_values(z, centre=True, chunk_rows=chunk_rows).square() / (z.shape[0] - 1)


def rankme(z: torch.Tensor, eps: float = 1e-7, chunk_rows: int | None = None) -> float:
    """RankMe effective rank of an embedding matrix z: (N, D); between ~1 and min(N, D).

    "RankMe(Z) = exp(−Σ_k p_k log p_k), p_k = σ_k(Z) / ‖σ(Z)‖₁ + ε" with σ the singular values of Z
    (Garrido et al., ICML 2023). As in the paper, Z is not centred. `chunk_rows`: see `singular_values`.

    >>> round(rankme(torch.eye(5)), 3)
    5.0
    """
    check_features("z", z)
    values = singular_values(z, chunk_rows=chunk_rows)
    if values.sum() == 0:
        raise ValueError("z is all zeros; its singular values define no distribution.")
    return _exp_entropy(values, eps)


def lidar(views: torch.Tensor, delta: float = 1e-4, eps: float = 1e-8) -> float:
    """LiDAR: the effective rank of the LDA matrix of the surrogate task; views: (N, K, D).

    Each of the N images is a class and its K augmentations are that class's samples (Thilak et al., ICLR 2024):
        Σ_b = 1/(N−1) Σ_x (μ_x − μ)(μ_x − μ)ᵀ,
        Σ_w = 1/(N(K−1)) Σ_x Σ_i (e_xi − μ_x)(e_xi − μ_x)ᵀ + δ I,
        Σ_lidar = Σ_w^{−1/2} Σ_b Σ_w^{−1/2},  LiDAR = exp(−Σ p_i log p_i),  p_i = λ_i / ‖λ‖₁ + ε.
    δ = 1e-4 and ε = 1e-8 as in the paper; δ is absolute, so it matters only for directions whose within-class
    variance is at most of order δ. LiDAR counts directions that separate images relative to their augmentation
    noise: uninformative directions (noise only) score ~1/K (K views), against the large whitened between-image
    variance of informative ones, whatever their raw variance. Being scale-free, it is high
    for pure noise too (Σ_b ≈ Σ_w / K is isotropic after whitening); compare it across models, not to D.

    >>> g = torch.Generator().manual_seed(0)
    >>> views = 10 * torch.randn(100, 1, 3, generator=g) + torch.randn(100, 4, 3, generator=g)
    >>> 2.5 < lidar(views) <= 3
    True
    """
    if views.ndim != 3:
        raise ValueError(
            f"views must be 3-D (N images, K augmentations, D) but has shape {tuple(views.shape)}."
        )
    n, k, d = views.shape
    if n < 2 or k < 2:
        raise ValueError(
            f"views has {n} images with {k} augmentations each; LiDAR needs at least 2 of each "
            "(between-image and within-image covariances)."
        )
    check_features("views", views.reshape(n * k, d))
    if not delta > 0:
        raise ValueError(f"delta must be positive so that Σ_w is invertible, but got {delta}.")
    views = views.double()
    class_means = views.mean(dim=1)
    between = class_means - class_means.mean(dim=0)
    sigma_b = between.T @ between / (n - 1)
    within = (views - class_means[:, None]).reshape(n * k, d)
    sigma_w = within.T @ within / (n * (k - 1)) + delta * torch.eye(d, dtype=torch.float64, device=views.device)
    w_eigenvalues, w_vectors = torch.linalg.eigh(sigma_w)
    inverse_sqrt = (w_vectors * w_eigenvalues.rsqrt()) @ w_vectors.T
    eigenvalues = torch.linalg.eigvalsh(inverse_sqrt @ sigma_b @ inverse_sqrt).clamp_min(0)
    if eigenvalues.sum() == 0:
        raise ValueError("all images have the same mean embedding (Σ_b = 0); LiDAR is undefined.")
    return _exp_entropy(eigenvalues, eps)


def _resolved_eigenvalues(z: torch.Tensor, eigenvalues: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
    """The covariance eigenvalues of z (`eigenvalues` when given) and how many the samples resolve:
    i ≤ min(D, N−1), above λ_1·1e-12."""
    check_features("z", z, min_rows=3)
    eigenvalues = covariance_eigenvalues(z) if eigenvalues is None else eigenvalues
    usable = min(z.shape[1], z.shape[0] - 1)
    return eigenvalues, int((eigenvalues[:usable] > eigenvalues[0] * 1e-12).sum())


def alpha_req_fit_range(z: torch.Tensor, eigenvalues: torch.Tensor | None = None) -> tuple[int, int]:
    """The default α-ReQ fit range for z: (N, D): ranks 1 .. ⌈r/2⌉ of its r resolved eigenvalues (at least 2).

    Why the head half: the sample spectrum's tail bends (Marchenko–Pastur), so a fit over every resolved
    eigenvalue reads α = 0.56 for a true 0.5 at N = 4096, D = 256; over the first half it recovers sampled power
    laws α = 0.5, 1, 2 there to 0.2% (tests/test_probes_spectrum.py). With N < 10·D the bias grows again
    (0.52 for 0.5 at N = 1024); pass an explicit, shorter `fit_range` then.
    """
    _, resolved = _resolved_eigenvalues(z, eigenvalues)
    return 1, max(2, math.ceil(resolved / 2))


def alpha_req(z: torch.Tensor, fit_range: tuple[int, int] | None = None,
              eigenvalues: torch.Tensor | None = None) -> float:
    """α-ReQ: the decay exponent α of the covariance eigenspectrum, λ_i ∝ i^{−α}; z: (N, D).

    Agrawal et al. (NeurIPS 2022) fit a power law to the eigenspectrum; here α is minus the least-squares slope
    of log λ_i against log i over the 1-based ranks i in `fit_range` = (first, last), inclusive. The samples
    resolve eigenvalues i = 1 .. min(D, N−1), up to the first one below λ_1·1e-12 (numerically zero); by default
    the fit uses the first half of those (`alpha_req_fit_range`), where the sample spectrum follows the
    population's.

    >>> z = torch.diag(torch.arange(1, 9, dtype=torch.float64) ** -1.0)
    >>> round(alpha_req(torch.cat([z, -z])), 6)
    2.0
    """
    eigenvalues, resolved = _resolved_eigenvalues(z, eigenvalues)
    first, last = alpha_req_fit_range(z, eigenvalues) if fit_range is None else fit_range
    if not 1 <= first < last <= resolved:
        raise ValueError(
            f"fit_range ({first}, {last}) must satisfy 1 ≤ first < last ≤ {resolved}, the number of resolved "
            f"eigenvalues (N = {z.shape[0]} samples, D = {z.shape[1]})."
        )
    ranks = torch.arange(first, last + 1, dtype=torch.float64, device=eigenvalues.device)
    log_rank, log_eigenvalue = ranks.log(), eigenvalues[first - 1 : last].log()
    centred_rank = log_rank - log_rank.mean()
    slope = (centred_rank * (log_eigenvalue - log_eigenvalue.mean())).sum() / centred_rank.square().sum()
    return -float(slope)


def covariance_spectrum(z: torch.Tensor, top_k: int | None = None, eigenvalues: torch.Tensor | None = None) -> dict:
    """Eigenvalues, conditioning and effective rank of the sample covariance of z: (N, D).

    The condition number is computed only where the samples measure it. With N ≤ D the sample covariance has
    rank ≤ N−1, so its λ_min is 0 by construction, and clamping it (to 1e-7, say) reports 1e7·λ_max rather than
    a property of the features. And even where it is not 0, a sample eigenvalue far down the spectrum is biased
    low unless there are many samples per dimension (Marchenko–Pastur: on isotropic features with N = D the
    full-spectrum ratio reads ~4e5 where the truth is 1). So by default the condition number is λ_1 / λ_k over
    the top k = min(numerical rank, N // 10) eigenvalues, the ones with at least 10 samples each: the full
    spectrum (scope "full") only when N ≥ 10·D and the features span all D dimensions. `top_k` sets k
    explicitly. The "note" says which was used and why; "condition_number_all_resolved" is λ_1 over the smallest
    numerically non-zero eigenvalue, for comparison. The numerical rank counts eigenvalues above
    λ_1 · max(N, D) · eps(float64), i.e. singular values above ~1e-7·σ_1: directions further down are below
    the resolution of float32 features and are not counted.

    Returns {"eigenvalues": the min(N, D) largest, descending (the other D − min(N, D) are exactly 0),
    "n_samples", "dim", "rank_limit": min(N−1, D), "numerical_rank", "top_k", "condition_number",
    "condition_number_scope": "full" | "top_k", "condition_number_all_resolved", "effective_rank": exp of the
    entropy of λ/Σλ (Roy & Vetterli 2007), "participation_ratio": (Σλ)²/Σλ², "note"}.

    >>> x = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 2.0], [0.0, -2.0]]).repeat(5, 1)
    >>> covariance_spectrum(x)["condition_number"]
    4.0
    """
    check_features("z", z, min_rows=2)
    n, d = z.shape
    eigenvalues = covariance_eigenvalues(z) if eigenvalues is None else eigenvalues
    if eigenvalues[0] == 0:
        raise ValueError("every row of z is identical (zero covariance); there is no spectrum to condition.")
    rank_limit = min(n - 1, d)
    # On the eigenvalues (σ²), with float64's eps: directions below σ_1·sqrt(max(N, D)·eps) ≈ 1e-7·σ_1 count as
    # zero. A rule on σ with the input dtype's eps (NumPy's matrix_rank) would keep float64 directions further
    # down, but also count the float32 rounding of features that were converted to float64 as rank (a rank-1
    # float32 head output read λ_1/λ_2 = 4e20 that way).
    tolerance = eigenvalues[0] * max(n, d) * torch.finfo(torch.float64).eps
    numerical_rank = max(1, int((eigenvalues[:rank_limit] > tolerance).sum()))
    resolved = max(1, n // _SAMPLES_PER_DIM)
    if top_k is not None:
        if not 1 <= top_k <= numerical_rank:
            raise ValueError(
                f"top_k must lie in 1..{numerical_rank} (eigenvalues resolved by N = {n} samples in D = {d} "
                f"dimensions) but got {top_k}."
            )
        k, scope = top_k, "top_k"
        note = f"condition number λ_1/λ_{k} on the top {k} of {d} eigenvalues, as requested."
    elif min(numerical_rank, resolved) == d:
        k, scope = d, "full"
        note = f"condition number over the full spectrum: {n} samples in {d} dimensions."
    elif numerical_rank <= resolved:
        k, scope = numerical_rank, "top_k"
        reason = (
            f"{n} samples in {d} dimensions give a covariance of rank ≤ {rank_limit}"
            if n <= d
            else f"the features span only {numerical_rank} of {d} dimensions above the numerical floor "
            "(σ > ~1e-7·σ_1)"
        )
        note = (
            f"{reason}, so λ_min of the full spectrum is 0 and not a measurement; condition number λ_1/λ_{k} "
            f"on the top {k} eigenvalues instead."
        )
    else:
        k, scope = resolved, "top_k"
        note = (
            f"{n} samples in {d} dimensions: fewer than {_SAMPLES_PER_DIM} samples per dimension, so the sample "
            f"eigenvalues below the top {k} (N // {_SAMPLES_PER_DIM}) are biased low and λ_1/λ_min would overstate "
            f"the conditioning (here {float(eigenvalues[0] / eigenvalues[numerical_rank - 1]):.3g}, "
            f"condition_number_all_resolved); condition number λ_1/λ_{k} on the top {k} eigenvalues instead."
        )
    weights = eigenvalues / eigenvalues.sum()
    return {
        "eigenvalues": eigenvalues.tolist(),
        "n_samples": n,
        "dim": d,
        "rank_limit": rank_limit,
        "numerical_rank": numerical_rank,
        "top_k": k,
        "condition_number": float(eigenvalues[0] / eigenvalues[k - 1]),
        "condition_number_scope": scope,
        "condition_number_all_resolved": float(eigenvalues[0] / eigenvalues[numerical_rank - 1]),
        "effective_rank": math.exp(-float(torch.special.xlogy(weights, weights).sum())),
        "participation_ratio": float(eigenvalues.sum().square() / eigenvalues.square().sum()),
        "note": note,
    }
