"""The invariance probe: how close an image's augmented views lie in a tap's space. `view_spread_rel` (scale-free)
is invariance evidence; alignment, view cosine, uniformity and LiDAR describe."""

from __future__ import annotations

from dataclasses import dataclass, field

from headprobe.registry import POSITIVE

from ..declaration import CHUNKS, INVARIANCE, Metric, Probe
from ..tap_data import ProbeOutput, TapData, need_views


@dataclass
class InvarianceSpec:
    uniformity_t: float = field(default=2.0, metadata=POSITIVE)


def measure_invariance(tap: TapData, *, uniformity_t: float, chunk_rows: int | None = None) -> ProbeOutput:
    """Alignment, uniformity, view cosine (first two views of each image), LiDAR over all views, and the
    scale-free `view_spread_rel` (`view_geometry.view_spread`): the views' spread relative to random pairs of views of
    different images, in the tap's own space. Raw alignment and view cosine depend on how bunched the whole cloud
    is, so only `view_spread_rel` is invariance evidence for the buffer verdict; the others describe.

    The views are read a block of images at a time (`spectrum.image_blocks`: at most `chunk_rows` view rows,
    default `spectrum.CHUNK_ROWS`): every per-image value is computed from its own block (the same values as whole), and
    LiDAR's covariances are summed over the blocks (`lidar_pseudo_values`). What the intervals need is held whole:
    the first views on the sphere (uniformity's) and the view centroids (the spread ratio's), (N_v, D) each."""
    import torch

    from headprobe.stats.bootstrap import VIEW_IMAGES, Linearised, PerUnit, SpreadRatio, Uniformity

    from ..lidar_influence import lidar_pseudo_values
    from ..spectrum import image_blocks
    from ..view_geometry import alignment_per_pair, sphere_points, uniformity, view_cosine_per_pair, view_spread

    views = need_views(tap, "invariance")
    n, k, d = views.shape
    align, cosine, spread = (torch.empty(n, dtype=torch.float64) for _ in range(3))
    points = torch.empty(n, d, dtype=torch.float64, device=views.device)
    centroids = torch.empty(n, d, dtype=torch.float64)
    for block in image_blocks(n, k, chunk_rows):
        z1, z2 = views[block, 0], views[block, 1]
        align[block], cosine[block] = alignment_per_pair(z1, z2).cpu(), view_cosine_per_pair(z1, z2).cpu()
        points[block] = sphere_points(z1)
        spread[block], centroids[block] = (part.cpu() for part in view_spread(views[block]))
    relative = SpreadRatio(spread, centroids, VIEW_IMAGES)
    # LiDAR (`spectrum.lidar`) is the mean of its per-image pseudo-values exactly (to float64 round-off, ~1e-15
    # relative), so one eigen-decomposition gives the metric and its interval.
    lidar_values = lidar_pseudo_values(views, chunk_rows=chunk_rows)
    metrics = {"align": float(align.mean()), "uniform": uniformity(points, t=uniformity_t, on_sphere=True),
               "view_cos": float(cosine.mean()), "lidar": float(lidar_values.mean()),
               "view_spread_rel": relative.value()}
    protocol = {"pairs": "views 0 and 1 of each image", "n_images": len(views), "views": k,
                "uniformity_t": uniformity_t,
                "view_spread_rel": f"all {k} views of each image, unnormalised: the mean squared distance of a "
                                   "view to its image's view centroid over the mean squared distance between "
                                   "views of two different images; two views of one image are on average "
                                   f"{2 * k / (k - 1):g} x view_spread_rel as far apart (squared) as two random "
                                   f"views; {(k - 1) / (2 * k):g} = no invariance, 0 = views coincide",
                "evidence": "view_spread_rel (scale-free); align, view_cos, uniform, lidar describe",
                "intervals": {"uniform": "bootstrap over images with views, recomputed on each resample",
                              "lidar": "linearised (delta-method) bootstrap over images with views"}}
    return ProbeOutput(metrics, protocol,
                       {"align": PerUnit(align, VIEW_IMAGES), "view_cos": PerUnit(cosine, VIEW_IMAGES),
                        "view_spread_rel": relative,
                        "uniform": Uniformity(points.cpu(), uniformity_t, VIEW_IMAGES),
                        "lidar": Linearised(lidar_values, VIEW_IMAGES)})


INVARIANCE = Probe(
    "invariance", measure_invariance, "alignment, uniformity, view cosine and LiDAR over the augmented views",
    options=InvarianceSpec, needs=("views",), reads=CHUNKS,
    reads_why="blocks of images, spectrum.image_blocks; holds, for its intervals, the first views on the sphere "
              "and the view centroids, (N_v, D) each",
    cost=2.0, cost_source="benchmarks/results/probe_costs.json",
    metrics=(
        Metric("align", "mean squared distance between two views of an image, L2-normalised (Wang & Isola)",
               "squared distance on the unit sphere, in [0, 4]",
               "lower = views closer; raw: moves with the spread of the whole cloud (a description)",
               shown_with=("Q-class",), headline=6),
        Metric("view_cos", "mean cosine between two views of an image", "cosine, in [−1, 1]",
               "higher = views closer; raw: moves with the spread of the whole cloud (a description)", headline=7),
        Metric("view_spread_rel", "spread of an image's views around their centroid over the distance between "
               "views of different images, in the tap's own space", "ratio (scale-free)",
               "lower = more invariance to the augmentations", role=INVARIANCE, predicted=-1, answers=("Q-inv",)),
        Metric("uniform", "log of the mean Gaussian potential between L2-normalised features (Wang & Isola)",
               "log potential, ≤ 0", "lower = spread more uniformly on the sphere", shown_with=("Q-class",),
               headline=8),
        Metric("lidar", "LiDAR: effective rank of the linear discriminant of images by their views",
               "effective rank (dims)", "higher = more distinguishable directions", headline=10),
    ),
)
