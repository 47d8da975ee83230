"""Where a tap puts the views of one image, on the unit sphere and in the raw space: alignment and view cosine of
paired views, uniformity (Wang & Isola, 2020), and the scale-free view spread (`view_spread_rel`). Split from
`probes/spectrum.py` (the spectra and effective ranks).

All take features as tensors, compute in float64 on the features' device, and return Python floats or per-pair
tensors.
"""

from __future__ import annotations

import math

import torch

from headprobe.checks import check_features

__all__ = [
    "alignment",
    "alignment_per_pair",
    "sphere_points",
    "uniformity",
    "view_cosine",
    "view_cosine_per_pair",
    "view_spread",
]


def _check_views(z1: torch.Tensor, z2: torch.Tensor) -> None:
    check_features("z1", z1)
    check_features("z2", z2)
    if z1.shape != z2.shape:
        raise ValueError(
            f"z1 has shape {tuple(z1.shape)} but z2 has {tuple(z2.shape)}; row i of each must be two views of "
            "sample i in one space."
        )


def _on_sphere(name: str, z: torch.Tensor) -> torch.Tensor:
    z = z.double()
    # Each row is first divided by its largest |entry|: the squares in the norm cannot overflow (float64 rows
    # above ~1e154 did, turning uniformity and view cosines into silent nonsense) nor underflow.
    z = z / z.abs().amax(dim=1, keepdim=True).clamp_min(torch.finfo(z.dtype).tiny)
    norms = z.norm(dim=1)
    if (norms == 0).any():
        raise ValueError(
            f"row {int((norms == 0).nonzero()[0])} of {name} is all zeros and has no direction on the sphere; "
            "drop it or check the features for collapse."
        )
    return z / norms[:, None]



def alignment(z1: torch.Tensor, z2: torch.Tensor, alpha: float = 2.0) -> float:
    """Alignment E ‖f(x) − f(y)‖^α over positive pairs, on L2-normalised features; z1, z2: (N, D).

    "L_align(f; α) ≜ E_{(x,y)∼p_pos} [‖f(x) − f(y)‖₂^α]" (Wang & Isola, ICML 2020, who use α = 2). 0 when the
    views coincide in direction; at most 2^α.

    >>> alignment(torch.tensor([[1.0, 0.0]]), torch.tensor([[-3.0, 0.0]]))
    4.0
    """
    return float(alignment_per_pair(z1, z2, alpha).mean())


def alignment_per_pair(z1: torch.Tensor, z2: torch.Tensor, alpha: float = 2.0) -> torch.Tensor:
    """‖f(x_i) − f(y_i)‖^α of each positive pair on L2-normalised features: (N,) float64; `alignment` is its mean
    (the per-pair values are what a bootstrap over images resamples)."""
    _check_views(z1, z2)
    if not alpha > 0:
        raise ValueError(f"alpha must be positive but got {alpha}; Wang & Isola use 2.")
    difference = _on_sphere("z1", z1) - _on_sphere("z2", z2)
    return difference.norm(dim=1).pow(alpha)


def sphere_points(z: torch.Tensor) -> torch.Tensor:
    """z: (N, D) -> its rows L2-normalised in float64, the points alignment, uniformity and view cosines use."""
    check_features("z", z)
    return _on_sphere("z", z)


def view_spread(views: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each image's spread over its views in the representation's own space (not normalised); views: (N, K, D)
    -> (spread (N,) float64: mean squared distance of the K views to their centroid, centroids (N, D) float64).

    With `stats.SpreadRatio` these give `view_spread_rel` = S / (2N/(N−1)·C + 2S): the spread relative to the
    mean squared distance between views of two different images (S: mean spread, C: the centroids' scatter), the
    same scale-free ratio as `orbit.spread_rel`. Positive pairs (two views of one image) lie on average
    2K/(K−1) · view_spread_rel as far apart, in squared distance, as random pairs of views of different images:
    1/(2K/(K−1)) when the views are no closer than random pairs, 0 when they coincide; multiplying the
    features by a constant changes nothing.
    """
    if views.ndim != 3 or views.shape[0] < 2 or views.shape[1] < 2:
        raise ValueError(f"views must be (N images, K views, D) with N >= 2 and K >= 2, got {tuple(views.shape)}.")
    check_features("views", views.reshape(-1, views.shape[-1]))
    views = views.double()
    centroids = views.mean(dim=1)
    return (views - centroids[:, None]).square().sum(dim=-1).mean(dim=1), centroids


def uniformity(z: torch.Tensor, t: float = 2.0, chunk_size: int = 1024, on_sphere: bool = False) -> float:
    """Uniformity log E exp(−t ‖f(x) − f(y)‖²) over the N(N−1)/2 distinct pairs, L2-normalised; z: (N, D).

    "L_uniform(f; t) ≜ log E_{x,y ∼ p_data} [e^{−t ‖f(x)−f(y)‖₂²}]" (Wang & Isola 2020, t = 2). Lower is more
    uniform; 0 means every point coincides. Computed in row chunks of `chunk_size` with a streaming log-sum-exp,
    so memory is O(chunk_size × N). `on_sphere`: z is `sphere_points` already (normalised again otherwise).

    >>> uniformity(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))
    -8.0
    """
    check_features("z", z, min_rows=2)
    if not t > 0:
        raise ValueError(f"t must be positive but got {t}; Wang & Isola use 2.")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive but got {chunk_size}.")
    z = z if on_sphere else _on_sphere("z", z)
    n = z.shape[0]
    columns = torch.arange(n, device=z.device)
    total = torch.tensor(-math.inf, dtype=torch.float64, device=z.device)
    for start in range(0, n - 1, chunk_size):
        rows = torch.arange(start, min(start + chunk_size, n), device=z.device)
        squared_distance = (2 - 2 * z[rows] @ z.T).clamp_min(0)
        exponent = (-t * squared_distance).masked_fill(columns[None] <= rows[:, None], -math.inf)
        total = torch.logaddexp(total, exponent.logsumexp(dim=(0, 1)))
    return float(total) - math.log(n * (n - 1) / 2)


def view_cosine(z1: torch.Tensor, z2: torch.Tensor) -> float:
    """Mean cosine similarity between paired views; z1, z2: (N, D) -> value in [−1, 1].

    >>> view_cosine(torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([[3.0, 0.0], [1.0, 0.0]]))
    0.5
    """
    return float(view_cosine_per_pair(z1, z2).mean())


def view_cosine_per_pair(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of each pair of views: (N,) float64; `view_cosine` is its mean."""
    _check_views(z1, z2)
    return (_on_sphere("z1", z1) * _on_sphere("z2", z2)).sum(dim=1)
