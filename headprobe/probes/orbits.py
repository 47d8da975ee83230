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

`orbit_images` makes the images of one sweep; the caller extracts a tap's representation of each, stacks them as
``traj: (N images, T steps, D)`` and hands that to `orbit_measures` (numbers) or `orbit_pca` (a 2-D picture).

>>> from PIL import Image
>>> images = orbit_images(Image.new("RGB", (32, 32), "red"), "rotation360")
>>> len(images), sweep_values("rotation360")[:3], anchor_index("hue")
(12, [0.0, 30.0, 60.0], 5)
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from ..checks import check_finite, check_floating
from ..registry import unknown_name_message

__all__ = [
    "ORBIT_SWEEPS",
    "OrbitSweep",
    "anchor_index",
    "orbit_images",
    "orbit_measures",
    "orbit_pca",
    "sweep_values",
    "trajectory_curvature",
]

# Entries of one block of the between-image distance matrix (float64: 32 MiB).
_PAIR_BLOCK = 1 << 22


@dataclass(frozen=True)
class OrbitSweep:
    """One augmentation swept from `low` to `high` in `steps` values, `identity` being the unchanged image.

    op: "rotate" (degrees counter-clockwise), "hue" (shift as a fraction of the colour wheel), "saturation"
        (factor; 0 is grey) or "blur" (Gaussian sigma in pixels of the image handed to `orbit_images`).
    cyclic: the sweep goes once round a circle and stops one step short of `high` (which equals `low`); its
        trajectory is closed, so curvature wraps around.
    """

    op: str
    low: float
    high: float
    steps: int
    identity: float
    cyclic: bool = False


ORBIT_SWEEPS: Mapping[str, OrbitSweep] = types.MappingProxyType(
    {
        # the paper's curvature sweep: "10 angles in 0–45°"
        "rotation45": OrbitSweep("rotate", 0.0, 45.0, 10, identity=0.0),
        # the paper's orbits: "rotated in 12 steps", i.e. 0, 30, ..., 330°
        "rotation360": OrbitSweep("rotate", 0.0, 360.0, 12, identity=0.0, cyclic=True),
        # −0.5 and +0.5 are the same half-turn of the colour wheel, reached from both sides of the anchor
        "hue": OrbitSweep("hue", -0.5, 0.5, 11, identity=0.0),
        "saturation": OrbitSweep("saturation", 0.0, 2.0, 11, identity=1.0),
        "blur": OrbitSweep("blur", 0.0, 3.0, 7, identity=0.0),
    }
)


def _sweep(sweep: str) -> OrbitSweep:
    if sweep not in ORBIT_SWEEPS:
        raise ValueError(unknown_name_message("orbit sweep", sweep, list(ORBIT_SWEEPS)))
    return ORBIT_SWEEPS[sweep]


def sweep_values(sweep: str, steps: int | None = None) -> list[float]:
    """The `steps` augmentation values of a sweep, in order (default: the preset's steps).

    Open sweeps include both ends; the cyclic one (rotation360) stops one step before a full turn. The identity
    value is always one of them (exactly), so hue and saturation, centred on it, need an odd number of steps.

    >>> sweep_values("saturation", 5)
    [0.0, 0.5, 1.0, 1.5, 2.0]
    """
    spec = _sweep(sweep)
    steps = spec.steps if steps is None else steps
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 3:
        raise ValueError(
            f"orbit sweep {sweep!r} needs an int number of steps >= 3 (curvature takes second differences); "
            f"got {steps!r}."
        )
    intervals = steps if spec.cyclic else steps - 1
    values = [round(spec.low + (spec.high - spec.low) * k / intervals, 12) for k in range(steps)]
    anchor = min(range(steps), key=lambda k: abs(values[k] - spec.identity))
    if abs(values[anchor] - spec.identity) > 1e-9 * (spec.high - spec.low):
        raise ValueError(
            f"orbit sweep {sweep!r} with {steps} steps does not pass through its identity value {spec.identity}, "
            "which the orbit's anchor must be; use an odd number of steps."
        )
    values[anchor] = spec.identity
    return values


def anchor_index(sweep: str, steps: int | None = None) -> int:
    """Index of the unchanged image (the anchor) in the sweep: 0 for rotations and blur, the middle for hue and
    saturation."""
    return sweep_values(sweep, steps).index(_sweep(sweep).identity)


def _on_floats(image: Image.Image, op: str, value: float) -> Image.Image:
    # PIL's hue shift works on 8-bit HSV, so it moves in 1/255 turns and ±0.5 land on different colours; the
    # float path rounds once, at the end, which keeps the orbit free of quantisation jitter.
    from torchvision.transforms.v2 import functional as F

    pixels = F.pil_to_tensor(image).double() / 255
    if op == "hue":
        pixels = F.adjust_hue(pixels, value)
    elif op == "saturation":
        pixels = F.adjust_saturation(pixels, value)
    else:
        # ±3 sigma, capped so reflect padding stays smaller than the image (as data.augment.apply_view)
        kernel = min(2 * math.ceil(3 * value) + 1, 2 * min(image.size) - 1)
        pixels = F.gaussian_blur(pixels, [kernel, kernel], [value, value])
    return F.to_pil_image((pixels * 255).round().clamp(0, 255).to(torch.uint8))


def orbit_images(image: Image.Image, sweep: str, steps: int | None = None) -> list[Image.Image]:
    """The orbit of one image under a sweep: `steps` RGB images of the input's size, in `sweep_values` order.

    Deterministic (no randomness at all). The image at the identity value (index `anchor_index`) is the input
    itself, converted to RGB, untouched by any resampling. Rotation turns counter-clockwise about the centre with
    bilinear interpolation and keeps the size; corners that come from outside the original are black (torchvision's
    RandomRotation default, also used by data.augment), so their area varies with the angle — the representation
    sees them, as it did in the paper. Multiples of 90° on a square image are exact pixel permutations with no
    corners. Hue, saturation and blur run in floating point and round to 8 bits once. Apply this to the image at
    the backbone's input size (after resize and centre crop, before normalisation) so that blur sigmas and the
    rotation's corners are in input pixels.

    >>> [im.size for im in orbit_images(Image.new("L", (20, 10)), "blur", 3)]
    [(20, 10), (20, 10), (20, 10)]
    """
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as F

    spec = _sweep(sweep)
    values = sweep_values(sweep, steps)
    if image.mode != "RGB":
        image = image.convert("RGB")
    orbit = []
    for value in values:
        if value == spec.identity:
            orbit.append(image.copy())
        elif spec.op == "rotate":
            orbit.append(F.rotate(image, value, interpolation=InterpolationMode.BILINEAR, expand=False, fill=0))
        else:
            orbit.append(_on_floats(image, spec.op, value))
    return orbit


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
    traj = _check_traj(traj)
    n, t, _ = traj.shape
    anchor, cyclic = 0, False
    if sweep is not None:
        anchor, cyclic = anchor_index(sweep, t), ORBIT_SWEEPS[sweep].cyclic
    unit = _unit(traj)
    space = unit if normalize else traj

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
