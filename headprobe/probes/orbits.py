"""Orbits: how a representation moves when one augmentation is swept over a fixed image.

The paper rotates test images "in 12 steps" and measures, per representation space, the orbit spread (mean
squared distance to the orbit centroid), D_intra, D_inter (between *class* centroids) and D_inter/D_intra, and the
trajectory curvature
"κ = mean |r_{i+1} − 2r_i + r_{i−1}| on L2-normalised representations over 10 angles in 0–45°"; on pretrained
models it sweeps hue, saturation and blur too and adds the effective rank of the trajectory and the cosine to the
anchor. Its orbit spreads were compared across spaces of different scale, and the head was fed L2-normalised z
although it was trained on unnormalised z, so uniform shrinking read as invariance. Here every scale-dependent
measure comes with a scale-free twin, relative to the distances between *different* images in the same space,
and `orbit_measures` says which space it measured in.

`headprobe.data.orbits.orbit_images` makes the images of one sweep; the caller extracts a tap's representation of
each, stacks them as ``traj: (N images, T steps, D)`` and hands that to `orbit_measures` (numbers) or `orbit_pca`
(a 2-D picture).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..checks import check_finite, check_floating
from ..data.orbits import ORBIT_SWEEPS, OrbitSweep, anchor_index, orbit_images, orbit_sweep, sweep_values

__all__ = [
    "ORBIT_SWEEPS",
    "OrbitSweep",
    "anchor_index",
    "orbit_images",
    "orbit_measures",
    "orbit_pca",
    "orbit_units",
    "sweep_values",
    "trajectory_curvature",
]

# Entries of one block of the between-image distance matrix (float64: 32 MiB).
_PAIR_BLOCK = 1 << 22


def _check_traj(traj: torch.Tensor | np.ndarray) -> torch.Tensor:
    traj = torch.as_tensor(traj)
    if traj.ndim != 3:
        raise ValueError(
            f"traj must be 3-D (N images, T steps, D) but has shape {tuple(traj.shape)}; stack each image's orbit "
            "representations along dim 1."
        )
    n, t, d = traj.shape
    if n < 2 or t < 3 or d < 1:
        raise ValueError(
            f"traj has shape {tuple(traj.shape)}; orbits need N >= 2 images (D_inter compares them), "
            "T >= 3 steps (curvature takes second differences) and D >= 1."
        )
    check_floating("traj", traj, "representations")
    check_finite("traj", traj)
    return traj.double()


def _unit(traj: torch.Tensor) -> torch.Tensor:
    traj = traj / traj.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(traj.dtype).tiny)  # no overflow
    norms = traj.norm(dim=-1, keepdim=True)
    if (norms == 0).any():
        i, t = (int(x) for x in (norms[..., 0] == 0).nonzero()[0])
        raise ValueError(
            f"traj[{i}, {t}] is all zeros and has no direction; curvature and cosines need L2-normalised "
            "representations (a dead or collapsed tap?)."
        )
    return traj / norms


def trajectory_curvature(traj: torch.Tensor | np.ndarray, *, on_sphere: bool = True, cyclic: bool = False) -> float:
    """κ = mean ‖r_{t+1} − 2 r_t + r_{t−1}‖ over interior steps t and images; traj: (N, T, D).

    As in the paper, on L2-normalised representations (`on_sphere`), which makes κ scale-free; on a great
    circle walked in equal angles Δ every term is 2(1 − cos Δ). `cyclic` closes the trajectory (step T−1 is
    followed by step 0) for sweeps that go once round, so all T steps count. 0 for a straight line walked in
    equal steps when `on_sphere` is False.

    >>> line = torch.arange(4.0)[None, :, None] * torch.ones(2, 1, 3)
    >>> trajectory_curvature(line, on_sphere=False)
    0.0
    """
    traj = _check_traj(traj)
    r = _unit(traj) if on_sphere else traj
    if cyclic:
        second = r.roll(-1, dims=1) - 2 * r + r.roll(1, dims=1)
    else:
        second = r[:, 2:] - 2 * r[:, 1:-1] + r[:, :-2]
    return float(second.norm(dim=-1).mean())


def _mean_between_image_distance(traj: torch.Tensor) -> float:
    """Mean ‖r_{i,t} − r_{j,s}‖ over all i ≠ j and all t, s: every pair of representations of distinct images."""
    n, t, d = traj.shape
    points = traj.reshape(n * t, d)
    owner = torch.arange(n, device=traj.device).repeat_interleave(t)
    block = max(1, _PAIR_BLOCK // (n * t * t))
    total = 0.0
    for start in range(0, n, block):
        rows = slice(start * t, min(start + block, n) * t)
        distances = torch.cdist(points[rows], points)
        total += float(distances.masked_fill(owner[rows, None] == owner[None], 0).sum())
    return total / (n * (n - 1) * t * t)


def _effective_rank(orbit: torch.Tensor) -> float:
    """exp-entropy of the normalised singular values of one centred orbit (T, D); 0 for an orbit that is a point."""
    singular_values = torch.linalg.svdvals(orbit - orbit.mean(dim=0))
    if singular_values.sum() == 0:
        return 0.0
    p = singular_values / singular_values.sum()
    return math.exp(-float(torch.special.xlogy(p, p).sum()))


def _space_note(normalize: bool) -> str:
    if normalize:
        return (
            "l2-normalised: every representation was scaled to unit norm before measuring (the paper's protocol); "
            "curvature and cos_anchor are scale-free; *_rel divide by the distances between different images."
        )
    return (
        "raw: measured in the tap's own space, unnormalised (for the backbone, the space its heads were trained "
        "on); raw spread and distances carry that space's scale, so compare spaces with *_rel, d_ratio(_image), "
        "curvature (on L2-normalised representations) and cos_anchor."
    )


def _class_centroids(space: torch.Tensor, labels: torch.Tensor | np.ndarray) -> torch.Tensor:
    """ν_c = mean of r_it over the images i of class c and all steps t, one row per class present: (K, D)."""
    labels = torch.as_tensor(labels)
    n = space.shape[0]
    if labels.shape != (n,) or labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(
            f"labels must be an integer tensor of shape ({n},), the class of each orbit's image, but has shape "
            f"{tuple(labels.shape)} and dtype {labels.dtype}."
        )
    classes, owner = torch.unique(labels.to(space.device), return_inverse=True)
    if len(classes) < 2:
        raise ValueError(
            f"the {n} orbit images are all of class {int(classes[0])}; D_inter is the distance between class "
            "centroids and needs >= 2 classes: use more orbit images, or pass labels=None to get only the "
            "image-centroid d_inter_image and d_ratio_image."
        )
    sums = torch.zeros(len(classes), space.shape[-1], dtype=space.dtype, device=space.device)
    sums.index_add_(0, owner, space.sum(dim=1))
    return sums / (torch.bincount(owner, minlength=len(classes)) * space.shape[1])[:, None]


def _mean_distinct_distance(points: torch.Tensor) -> float:
    """mean_{a≠b} ‖p_a − p_b‖ over the rows of points (M ≥ 2, D)."""
    m = points.shape[0]
    return float(torch.cdist(points, points, compute_mode="donot_use_mm_for_euclid_dist").sum()) / (m * (m - 1))


def _centroid_note(n: int, n_classes: int | None) -> str:
    image = f"d_inter_image, d_ratio_image: between the {n} image-orbit centroids (not the paper's D_inter)"
    if n_classes is None:
        return f"{image}; without labels the paper's d_inter and d_ratio (between class centroids) are absent."
    return f"d_inter, d_ratio: between the {n_classes} class centroids of the orbit images (the paper's); {image}."


def _orbit_space(traj, normalize: bool, sweep: str | None):
    """The checked trajectories, their unit-norm copy, the space measured in, and the sweep's anchor and closure."""
    traj = _check_traj(traj)
    anchor, cyclic = 0, False
    if sweep is not None:
        anchor, cyclic = anchor_index(sweep, traj.shape[1]), orbit_sweep(sweep).cyclic
    unit = _unit(traj)
    return traj, unit, unit if normalize else traj, anchor, cyclic


def orbit_measures(
    traj: torch.Tensor | np.ndarray,
    normalize: bool = False,
    *,
    sweep: str | None = None,
    labels: torch.Tensor | np.ndarray | None = None,
) -> dict:
    """Invariance of one tap to one sweep, from its orbits traj: (N images, T steps, D), image i of class labels[i].

    With μ_i the centroid of image i's orbit, ν_c = mean of r_it over the images i of class c and all t (the class
    centroid; K classes present), and pairs (i, t), (j, s) over distinct images i ≠ j:
        orbit.spread      mean_i mean_t ‖r_it − μ_i‖²  (the paper's "mean squared distance to orbit centroid")
        orbit.d_intra     mean_i mean_{t≠s} ‖r_it − r_is‖  (the paper's D_intra)
        orbit.d_inter     mean_{c≠c'} ‖ν_c − ν_c'‖, the paper's D_inter: the mean distance between class
                          centroids (its released CIFAR-10 arrays: 5 classes among 15 orbits); orbit.d_ratio =
                          d_inter / d_intra, the paper's D_inter / D_intra. Only with `labels` naming >= 2 classes.
        orbit.d_inter_image  mean_{i≠j} ‖μ_i − μ_j‖, between image-orbit centroids (not the paper's: on its
                          arrays this gives 0.684 vs 0.180 where class centroids give 0.432 vs 0.111);
                          orbit.d_ratio_image = d_inter_image / d_intra
        orbit.pair_sq_dist, orbit.pair_dist   mean ‖r_it − r_js‖², mean ‖r_it − r_js‖: the space's scale, what
                          random pairs of different images are apart (the exact mean over all pairs, not a sample)
        orbit.spread_rel  spread / pair_sq_dist, in [0, 1/2]: 0 for invariance, 1/2 when the orbits are as
                          wide as the whole cloud; orbit.d_intra_rel = d_intra / pair_dist
        orbit.curvature   `trajectory_curvature` on L2-normalised representations (cyclic for cyclic sweeps)
        orbit.cos_anchor  mean_i mean_{t≠a} cos(r_it, r_ia), a the anchor (unchanged image)
        orbit.eff_rank    mean_i of exp-entropy of the normalised singular values of image i's centred orbit
                          (0 for an orbit that is one point)
    Multiplying every representation by c multiplies spread, pair_sq_dist by c² and d_* by |c| and leaves every
    other number unchanged, so uniform shrinking (the normalisation artefact) moves only the raw numbers.

    normalize: measure on L2-normalised representations (the paper's protocol) instead of the raw space the head
        was trained on; the returned "space" note says which.
    sweep: the `ORBIT_SWEEPS` name that made the orbits: sets the anchor (`anchor_index(sweep, T)`) and closes
        the trajectory of cyclic sweeps. Without it the anchor is step 0 and the trajectory is open.
    labels: (N,) integer class of each orbit's image. Without it d_inter and d_ratio are absent (never replaced
        by the image-centroid numbers); with fewer than 2 classes it is a ValueError.

    Returns the "orbit.*" floats above, "space" and "centroids", sentences saying where it measured and which
    centroids each D_inter compares. Cost O((N·T)² D) for pair_dist, computed in blocks.

    >>> square = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])
    >>> m = orbit_measures(torch.stack([square, square + 10, square + 12]), labels=torch.tensor([0, 1, 1]))
    >>> m["orbit.spread"], round(m["orbit.d_ratio"], 4), round(m["orbit.d_ratio_image"], 4), m["orbit.eff_rank"]
    (1.0, 9.6655, 7.0294, 2.0)
    """
    traj, unit, space, anchor, cyclic = _orbit_space(traj, normalize, sweep)
    n, t, _ = traj.shape
    centroids = space.mean(dim=1)
    spread_per_image = (space - centroids[:, None]).square().sum(dim=-1).mean(dim=1)
    spread = float(spread_per_image.mean())
    within = torch.cdist(space, space, compute_mode="donot_use_mm_for_euclid_dist")
    d_intra = float(within.sum()) / (n * t * (t - 1))
    d_inter_image = _mean_distinct_distance(centroids)
    class_centroids = None if labels is None else _class_centroids(space, labels)
    d_inter = None if class_centroids is None else _mean_distinct_distance(class_centroids)
    # E‖r_it − r_js‖² = ‖μ_i − μ_j‖² + spread_i + spread_j, and the mean of ‖μ_i − μ_j‖² over i ≠ j is
    # 2N/(N−1) times the centroids' mean squared distance to their mean.
    centroid_scatter = float((centroids - centroids.mean(dim=0)).square().sum(dim=-1).mean())
    pair_sq_dist = 2 * n / (n - 1) * centroid_scatter + 2 * spread
    pair_dist = _mean_between_image_distance(space)
    if pair_sq_dist == 0:
        raise ValueError(
            "every representation in traj is the same point; the orbit measures are undefined (a collapsed tap?)."
        )
    if d_intra == 0:
        raise ValueError(
            "no orbit in traj moves at all (D_intra = 0), so D_inter / D_intra is undefined; was the sweep "
            "applied (e.g. hue does nothing to grey images)?"
        )

    others = [s for s in range(t) if s != anchor]
    cos_anchor = float((unit[:, others] * unit[:, anchor : anchor + 1]).sum(dim=-1).mean())
    class_measures = {} if d_inter is None else {"orbit.d_inter": d_inter, "orbit.d_ratio": d_inter / d_intra}
    return {
        "orbit.spread": spread,
        "orbit.spread_rel": spread / pair_sq_dist,
        "orbit.d_intra": d_intra,
        "orbit.d_intra_rel": d_intra / pair_dist,
        **class_measures,
        "orbit.d_inter_image": d_inter_image,
        "orbit.d_ratio_image": d_inter_image / d_intra,
        "orbit.pair_sq_dist": pair_sq_dist,
        "orbit.pair_dist": pair_dist,
        "orbit.curvature": trajectory_curvature(traj, cyclic=cyclic),
        "orbit.cos_anchor": cos_anchor,
        "orbit.eff_rank": sum(_effective_rank(orbit) for orbit in space) / n,
        "space": _space_note(normalize),
        "centroids": _centroid_note(n, None if class_centroids is None else len(class_centroids)),
    }


def orbit_pca(traj: torch.Tensor | np.ndarray, n_images: int = 8) -> np.ndarray:
    """2-D PCA coordinates of the first `n_images` orbits (all of them if there are fewer), for plotting.

    One PCA is fitted on all T steps of those images together (centred on their mean), so the orbits share axes
    and can be drawn in one figure. Each axis's sign is fixed so that its largest-magnitude coordinate is
    positive, which makes the picture deterministic. traj: (N, T, D) -> float64 (min(n_images, N), T, 2); a
    second axis the points do not have (D = 1) is all zeros.

    >>> orbit_pca(torch.randn(20, 5, 64), n_images=8).shape
    (8, 5, 2)
    """
    traj = torch.as_tensor(traj)
    if traj.ndim != 3 or min(traj.shape) < 1:
        raise ValueError(f"traj must be a non-empty (N images, T steps, D) array but has shape {tuple(traj.shape)}.")
    if isinstance(n_images, bool) or not isinstance(n_images, (int, np.integer)) or n_images < 1:
        raise ValueError(f"n_images must be a positive int; got {n_images!r}.")
    shown = traj[:n_images].double()
    m, t, d = shown.shape
    points = shown.reshape(m * t, d)
    centred = points - points.mean(dim=0)
    u, s, _ = torch.linalg.svd(centred, full_matrices=False)
    coordinates = torch.zeros(m * t, 2, dtype=torch.float64, device=points.device)
    k = min(2, s.numel())
    scores = u[:, :k] * s[:k]
    signs = torch.sign(scores.gather(0, scores.abs().argmax(dim=0, keepdim=True)))
    coordinates[:, :k] = scores * torch.where(signs == 0, 1.0, signs)
    return coordinates.reshape(m, t, 2).cpu().numpy()


def orbit_units(traj: torch.Tensor | np.ndarray, normalize: bool = False, *, sweep: str | None = None) -> dict:
    """The orbit measures of `orbit_measures` taken apart by orbit image, for intervals over the images drawn.

    Per image i (N,): "spread", "d_intra", "curvature", "cos_anchor", "eff_rank" (each measure's mean over images
    is the measure); per pair of images (N, N): "centroid_dist" ‖μ_i − μ_j‖, "pair_dist" mean_{t,s} ‖r_it − r_js‖,
    "pair_sq_dist" mean_{t,s} ‖r_it − r_js‖² (their means over i ≠ j are d_inter_image, pair_dist, pair_sq_dist);
    and "centroids" μ (N, D) for the class centroids of d_inter. Same space, anchor and closure as
    `orbit_measures` with the same arguments. Cost O((N·T)² D), as pair_dist there.
    """
    traj, unit, space, anchor, cyclic = _orbit_space(traj, normalize, sweep)
    n, t, d = traj.shape
    centroids = space.mean(dim=1)
    spread = (space - centroids[:, None]).square().sum(dim=-1).mean(dim=1)
    within = torch.cdist(space, space, compute_mode="donot_use_mm_for_euclid_dist")
    second = (unit.roll(-1, dims=1) - 2 * unit + unit.roll(1, dims=1) if cyclic
              else unit[:, 2:] - 2 * unit[:, 1:-1] + unit[:, :-2])
    others = [s for s in range(t) if s != anchor]
    points = space.reshape(n * t, d)
    pair_dist = torch.zeros(n, n, dtype=space.dtype, device=space.device)
    block = max(1, _PAIR_BLOCK // (n * t * t))
    for start in range(0, n, block):
        rows = slice(start * t, min(start + block, n) * t)
        distances = torch.cdist(points[rows], points)
        pair_dist[start:start + block] = distances.reshape(-1, t, n, t).mean(dim=(1, 3))
    centroid_dist = torch.cdist(centroids, centroids, compute_mode="donot_use_mm_for_euclid_dist")
    return {
        "spread": spread,
        "d_intra": within.sum(dim=(1, 2)) / (t * (t - 1)),
        "curvature": second.norm(dim=-1).mean(dim=1),
        "cos_anchor": (unit[:, others] * unit[:, anchor : anchor + 1]).sum(dim=-1).mean(dim=1),
        "eff_rank": torch.tensor([_effective_rank(orbit) for orbit in space], dtype=torch.float64),
        "centroid_dist": centroid_dist,
        "pair_dist": pair_dist,
        "pair_sq_dist": centroid_dist.square() + spread[:, None] + spread[None, :],
        "centroids": centroids,
    }
