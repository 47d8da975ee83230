"""The orbits probe: a tap's orbits along augmentation sweeps (rotation, hue, saturation, blur): their spread, raw
and scale-free, the paper's D_inter / D_intra between class centroids, and curvature (`probes.orbits` computes
them; `probes.orbit_intervals` their intervals)."""

from __future__ import annotations

from dataclasses import dataclass, field

from headprobe.registry import ORBIT_SWEEPS, at_least, registered

from ..declaration import INVARIANCE, WHOLE, Metric, Probe, TrainImages
from ..tap_data import MissingInputError, ProbeOutput, TapData


@dataclass
class OrbitSpec:
    # The sweeps whose orbits the pipeline extracts (the probe measures every orbit it is given).
    sweeps: list[str] = field(default_factory=lambda: ["rotation45", "rotation360"], metadata=registered(ORBIT_SWEEPS))
    n_images: int = field(default=64, metadata=at_least(1))
    pca_images: int = field(default=8, metadata=at_least(1))


def check_orbits(options: OrbitSpec, train: TrainImages) -> None:
    if not options.sweeps:
        raise ValueError(f"probes.orbits.sweeps is empty; give at least one of: {', '.join(ORBIT_SWEEPS.names())}.")


def measure_orbits(tap: TapData, *, sweeps: list[str], n_images: int, pca_images: int) -> ProbeOutput:
    """Orbit geometry along each augmentation sweep (see `probes.orbits`), raw and scale-free, in the
    space the head was trained on (unnormalised taps); metrics are prefixed by the sweep name.

    `<sweep>.orbit.d_inter` and `.d_ratio` are the paper's (between class centroids, from `tap.orbit_labels`);
    they are absent when the tap has no orbit labels or the orbit images hold fewer than 2 classes, and the
    protocol's "centroids" sentence says so. `.d_inter_image` and `.d_ratio_image` compare image-orbit centroids
    and are always there."""
    import torch

    from ..orbit_intervals import orbit_statistics
    from ..orbits import orbit_measures, orbit_pca, sweep_values

    if tap.orbits is None:
        raise MissingInputError("probe 'orbits' needs orbit features; the pipeline extracts them when "
                                "probes.orbits is in the recipe.")
    metrics, protocol, per_unit = {}, {"n_images": n_images, "sweeps": {}}, {}
    labels, too_few = tap.orbit_labels, None
    if labels is not None and len(classes := torch.unique(labels)) < 2:
        too_few = (f"d_inter_image, d_ratio_image: between the {len(labels)} image-orbit centroids (not the paper's "
                   f"D_inter); the orbit images are all of class {int(classes[0])}, so the paper's d_inter and "
                   "d_ratio (between >= 2 class centroids) are absent: raise probes.orbits.n_images.")
        labels = None
    for sweep, traj in tap.orbits.items():
        try:
            out = orbit_measures(traj.double(), sweep=sweep, labels=labels)
        except ValueError as err:  # e.g. a hue sweep on grey images: record why, keep the other sweeps
            protocol["sweeps"][sweep] = {"skipped": str(err)}
            continue
        space, centroids = out.pop("space"), out.pop("centroids")
        protocol["centroids"] = too_few or centroids  # the same images, labels and sentence in every sweep
        metrics |= {f"{sweep}.{k}": float(v) for k, v in out.items()}
        protocol["sweeps"][sweep] = {"values": sweep_values(sweep, traj.shape[1]), "space": space,
                                     "pca": orbit_pca(traj.double(), n_images=pca_images).round(5).tolist()}
        # Every measure as a function of which orbit images are drawn, for its interval (spread_rel: the verdict).
        per_unit |= {f"{sweep}.{k}": v for k, v in orbit_statistics(traj.double(), sweep=sweep, labels=labels).items()
                     if f"{sweep}.{k}" in metrics}
    return ProbeOutput(metrics, protocol, per_unit)


def _orbit(measure: str, meaning: str, unit: str, direction: str, chance: float | None = None, note: str = "",
           **evidence) -> Metric:
    """`<sweep>.orbit.<measure>`, one per sweep."""
    return Metric("{sweep}.orbit." + measure, meaning + " ({sweep} sweep)", unit, direction, chance, note,
                  **evidence)


ORBITS = Probe(
    "orbits", measure_orbits,
    "orbits along rotation/hue/saturation/blur sweeps: spread (raw and scale-free), D_inter/D_intra between class "
    "centroids (the paper's; d_*_image: between image orbits), curvature",
    options=OrbitSpec, needs=("orbits",), check=check_orbits, cost=0.3, reads=WHOLE,
    reads_why="distances between the orbits of different images and a PCA over them; probes.orbits.n_images "
              "orbits, 64 by default, not the tap's N rows",
    cost_source="benchmarks/results/probe_costs.json",
    metrics=(
        _orbit("spread_rel", "spread of an image's orbit around its centroid over random pairs' squared distance",
               "ratio in [0, 1/2] (scale-free)", "lower = more invariance along the sweep", 0.5,
               "1/2 (the chance level shown) = orbits as wide as the whole cloud", role=INVARIANCE, predicted=-1,
               answers=("Q-inv",), headline=13),
        _orbit("spread", "mean squared distance of an orbit's points to its centroid",
               "squared distance (the tap's units)", "lower = more invariance, but scale-dependent (a description)"),
        _orbit("curvature", "mean turning of an orbit's trajectory on the unit sphere", "radians per step",
               "higher = more bent trajectories"),
        _orbit("d_ratio", "the paper's D_inter / D_intra: class-centroid distance over within-orbit distance",
               "ratio", "higher = classes further apart than an orbit is wide"),
        _orbit("d_inter", "the paper's D_inter: mean distance between class centroids", "distance (tap's units)",
               "higher = classes further apart (scale-dependent)"),
        _orbit("d_intra", "the paper's D_intra: mean distance within one image's orbit", "distance (tap's units)",
               "lower = more invariance (scale-dependent)"),
        _orbit("d_ratio_image", "image-centroid distance over within-orbit distance (not the paper's)", "ratio",
               "higher = images further apart than an orbit is wide"),
        _orbit("d_inter_image", "mean distance between image-orbit centroids (not the paper's)",
               "distance (tap's units)", "higher = images further apart (scale-dependent)"),
        _orbit("d_intra_rel", "D_intra over random pairs' distance", "ratio (scale-free)",
               "lower = more invariance along the sweep"),
        _orbit("cos_anchor", "mean cosine between an orbit's points and its unchanged image", "cosine, in [−1, 1]",
               "higher = more invariance along the sweep"),
        _orbit("eff_rank", "effective rank of an orbit's centred points", "effective rank (dims)",
               "higher = the orbit spans more directions"),
        _orbit("pair_sq_dist", "mean squared distance between points of different images: the space's scale",
               "squared distance (tap's units)", "a scale, not invariance"),
        _orbit("pair_dist", "mean distance between points of different images: the space's scale",
               "distance (tap's units)", "a scale, not invariance"),
    ),
)
