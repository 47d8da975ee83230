"""The probes a recipe names, applied uniformly to every tap.

Each registered probe takes a `TapData` (what one tap offers: clean train/test features, and
when heads are trained, the features of the cached augmented views and of rotated images) and
returns a `ProbeOutput` with flat metrics and the protocol that produced them. A probe that needs
data the run does not have (views without heads, say) says so instead of guessing.
"""

from __future__ import annotations

import torch

from headprobe.stats.bootstrap import (
    TEST_IMAGES,
    TRAIN_IMAGES,
    VIEW_IMAGES,
    Linearised,
    PerUnit,
    SpreadRatio,
    Uniformity,
)

from ..checks import check_features

# The probe interface (what a probe receives and returns) lives in tap_data.py; it is importable from here too.
from .augment_r2 import augment_r2  # noqa: F401  (registered from here, with the other built-in probes)
from .tap_data import MissingInputError, ProbeOutput, TapData, need_views


def linear(tap: TapData, **options) -> ProbeOutput:
    """Linear probe (class accuracy) and the label-MI lower bound I(Z;Y) ≥ H(Y) − CE of that probe, in nats."""
    from .label_mi import label_mi_lower_bound
    from .linear import linear_probe

    result = linear_probe(tap.train_x, tap.train_y, tap.test_x, tap.test_y, val_fraction=tap.val_fraction,
                          seed=tap.seed, **options)
    bound = label_mi_lower_bound(result.probabilities, tap.test_y)
    metrics = dict(result.metrics) | {"mi.label": bound["mi_lower_bound"]}
    protocol = result.protocol | {"mi.label": {k: v for k, v in bound.items() if k != "mi_lower_bound"}}
    y = tap.test_y.cpu().long()
    # H(Y) + log q(y_i | z_i) per image: its mean is the bound (H(Y) is fixed under a class-stratified resample).
    log_q = result.probabilities.double()[torch.arange(len(y)), y].clamp_min(bound["eps"]).log()
    per_unit = {"linear.acc": PerUnit((result.predictions == y).double(), TEST_IMAGES),
                "mi.label": PerUnit(bound["entropy_y"] + log_q, TEST_IMAGES)}
    return ProbeOutput(metrics, protocol, per_unit)


def knn(tap: TapData, shard_bank: bool | None = None, processes: tuple[int, int] | None = None,
        **options) -> ProbeOutput:
    """The k-NN probe. processes=(rank, world), given by the run when W > 1 processes call it together (which the
    run decides from `shard_bank`: `probe_sharing.shard_knn_bank`): each searches its 1/W of the training bank and
    they merge their partial top-k (`sharded_knn`)."""
    from .knn import knn as knn_probe

    if processes is not None and processes[1] > 1:
        from .sharded_knn import shard_rows, sharded_knn

        rank, world = processes
        rows = shard_rows(len(tap.train_x), world, rank)
        result = sharded_knn(tap.train_x[rows], tap.train_y[rows], tap.test_x, tap.test_y, offset=rows.start,
                             world=world, num_classes=tap.n_classes, **options)
    else:
        result = knn_probe(tap.train_x, tap.train_y, tap.test_x, tap.test_y, num_classes=tap.n_classes, **options)
    y = tap.test_y.cpu().long()
    per_unit = {f"knn.k{k}.acc": PerUnit((pred == y).double(), TEST_IMAGES) for k, pred in result.predictions.items()}
    return ProbeOutput(dict(result.metrics), result.protocol, per_unit)


def spectrum(tap: TapData, top_k: int | None = None) -> ProbeOutput:
    """RankMe, α-ReQ and the covariance spectrum of the clean training features (honest conditioning)."""
    from .influence import rankme_per_row
    from .spectrum import alpha_req, alpha_req_fit_range, covariance_eigenvalues, covariance_spectrum, rankme

    # Collapsed features (the paper's collapse experiments; a dead ReLU head gives all zeros) leave some of these
    # undefined: α-ReQ needs two resolved eigenvalues, the spectrum a non-zero covariance, RankMe a non-zero z.
    # Each is then recorded as undefined with the reason, and the tap keeps the others instead of failing the run.
    undefined: dict[str, str] = {}

    def attempt(name, compute):
        try:
            return compute()
        except ValueError as err:
            undefined[name] = str(err)
            return None

    metrics, protocol, per_unit = {}, {}, {}
    if (value := attempt("rankme", lambda: rankme(tap.train_x))) is not None:
        metrics["rankme"] = value
        # Its linearised bootstrap over the training images (`probes.influence`: recomputing it on resamples drawn
        # with replacement would bias it low).
        per_unit["rankme"] = Linearised(rankme_per_row(tap.train_x, value=value).cpu(), TRAIN_IMAGES)
    # One decomposition for α-ReQ's range and fit and the spectrum (each would otherwise take its own SVD); on
    # features it cannot take, each of them records its own reason below.
    try:
        check_features("z", tap.train_x, min_rows=2)
        eigenvalues = covariance_eigenvalues(tap.train_x)
    except ValueError:
        eigenvalues = None
    fit_range = attempt("alpha_req", lambda: alpha_req_fit_range(tap.train_x, eigenvalues))
    if fit_range is not None:
        if (value := attempt("alpha_req", lambda: alpha_req(tap.train_x, fit_range, eigenvalues))) is not None:
            metrics["alpha_req"] = value
    spec = attempt("cond", lambda: covariance_spectrum(tap.train_x, top_k=top_k, eigenvalues=eigenvalues))
    if spec is not None:
        metrics |= {"cond": spec["condition_number"], "eff_rank": spec["effective_rank"]}
        protocol = {k: spec[k] for k in ("n_samples", "dim", "rank_limit", "numerical_rank", "top_k",
                                         "condition_number_scope", "note")}
        protocol["eigenvalues_top"] = list(spec["eigenvalues"][:64])
    if "alpha_req" in metrics:
        protocol["alpha_req_fit_range"] = list(fit_range)
        protocol["alpha_req_fit"] = "ranks 1..ceil(r/2) of the r resolved covariance eigenvalues"
    if undefined:
        protocol["undefined"] = undefined
    return ProbeOutput(metrics, protocol, per_unit)


def invariance(tap: TapData, uniformity_t: float = 2.0) -> ProbeOutput:
    """Alignment, uniformity, view cosine (first two views of each image), LiDAR over all views, and the
    scale-free `view_spread_rel` (`spectrum.view_spread`): the views' spread relative to random pairs of views of
    different images, in the tap's own space. Raw alignment and view cosine depend on how bunched the whole cloud
    is, so only `view_spread_rel` is invariance evidence for the buffer verdict; the others describe."""
    from .lidar_influence import lidar_pseudo_values
    from .spectrum import alignment_per_pair, sphere_points, uniformity, view_cosine_per_pair, view_spread

    views = need_views(tap, "invariance")
    z1, z2 = views[:, 0], views[:, 1]
    align, cosine = alignment_per_pair(z1, z2).cpu(), view_cosine_per_pair(z1, z2).cpu()
    spread, centroids = view_spread(views)
    relative = SpreadRatio(spread.cpu(), centroids.cpu(), VIEW_IMAGES)
    # LiDAR (`spectrum.lidar`) is the mean of its per-image pseudo-values exactly (to float64 round-off, ~1e-15
    # relative), so one eigen-decomposition gives the metric and its interval.
    lidar_values = lidar_pseudo_values(views)
    metrics = {"align": float(align.mean()), "uniform": uniformity(z1, t=uniformity_t),
               "view_cos": float(cosine.mean()), "lidar": float(lidar_values.mean()),
               "view_spread_rel": relative.value()}
    k = views.shape[1]
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
                        "uniform": Uniformity(sphere_points(z1).cpu(), uniformity_t, VIEW_IMAGES),
                        "lidar": Linearised(lidar_values, VIEW_IMAGES)})


def view_mi(tap: TapData, batch_size: int = 128, temperature: float = 0.1, pca_dims: int = 32,
            critic: str = "cosine", critic_steps: int = 1000) -> ProbeOutput:
    """MI between two views of an image: InfoNCE (ceiling log B) with the fixed cosine critic or a trained
    separable critic (held-out pairs), and the Gaussian (CCA) closed form on the top k = min(pca_dims, D, N//10)
    principal components, fitted on the views themselves. The Gaussian value is the plug-in minus its exact
    small-sample bias for Gaussian data, without shrinkage (`gaussian_mi`): k ≤ N/10 keeps the joint 2k×2k
    correlation matrix invertible, and shrinking it would erase the cross-view correlation that is the MI."""
    import math

    from .influence import gaussian_mi_per_pair
    from .information import gaussian_mi, mutual_information

    views = need_views(tap, "view_mi")
    z1, z2 = views[:, 0].double(), views[:, 1].double()
    batch = min(batch_size, len(z1))
    options = {"temperature": temperature} if critic == "cosine" else {"steps": critic_steps}
    nce = mutual_information(z1, z2, method="infonce", critic=critic, batch_size=batch, seed=tap.seed, **options)
    both = torch.cat([z1, z2])
    k = min(pca_dims, both.shape[1], len(z1) // 10 or 1)
    mean = both.mean(0)
    _, _, v = torch.linalg.svd(both - mean, full_matrices=False)
    basis = v[:k].T
    gauss = gaussian_mi((z1 - mean) @ basis, (z2 - mean) @ basis, shrinkage=None, bias_correction=True)
    metrics = {"mi.infonce": nce["mi"], "mi.infonce.ceiling": nce["ceiling"], "mi.gaussian": gauss["mi"]}
    protocol = {"infonce": {k2: v2 for k2, v2 in nce.items() if k2 != "mi"},
                "gaussian": {"pca_dims": k, "pca_fit": "both views pooled", "n_samples": gauss["n_samples"],
                             "shrinkage": gauss["shrinkage"],
                             "shrinkage_why": "none: k <= N/10 keeps the joint correlation invertible, and "
                                              "shrinking it towards I erases the cross-view correlation (MI -> 0)",
                             "bias_correction": gauss["bias_correction"],
                             "bias_correction_source": gauss["bias_correction_source"],
                             "mi_plugin": gauss["mi_plugin"], "warning": gauss["warning"]}}
    # mi.gaussian's linearised bootstrap over the images with views (the PCA basis held fixed); none where
    # gaussian_mi dropped constant components or the MI is infinite. mi.infonce has no per-image values.
    per_unit = {}
    if math.isfinite(gauss["mi"]) and not any(gauss["constant_dims_dropped"].values()):
        values = gaussian_mi_per_pair((z1 - mean) @ basis, (z2 - mean) @ basis, gauss["mi"])
        per_unit["mi.gaussian"] = Linearised(values.cpu(), VIEW_IMAGES)
    return ProbeOutput(metrics, protocol, per_unit)


def rotation(tap: TapData, C_grid: list[float] | None = None, mlp_hidden: int = 256, mlp_epochs: int = 100
             ) -> ProbeOutput:
    """4-way rotation prediction (0/90/180/270°, chance 0.25) from each tap: a linear (logistic) probe with
    C chosen on validation, and a one-hidden-layer MLP probe — the paper's "guillotine" measurement."""
    from .linear import linear_probe
    from .rotated import per_image_accuracy, rotated_image_index

    if tap.rotated_train_x is None:
        raise MissingInputError("probe 'rotation' needs rotated images; the pipeline extracts them when "
                                "probes.rotation is in the recipe.")
    kwargs = {"C_grid": C_grid} if C_grid else {}
    # The 4 rotated copies of one image are near-duplicates: C is chosen on a validation split by image.
    groups = rotated_image_index(tap.rotated_train_y)
    lin = linear_probe(tap.rotated_train_x, tap.rotated_train_y, tap.rotated_test_x, tap.rotated_test_y,
                       val_fraction=tap.val_fraction, seed=tap.seed, groups=groups, **kwargs)
    y_test = tap.rotated_test_y.cpu()
    mlp_pred = _mlp_probe(tap, mlp_hidden, mlp_epochs)
    n_images = len(y_test) // 4
    # Intervals resample the N test images (each with its 4 rotations), not the 4N rows.
    per_unit = {"rotation.acc": PerUnit(per_image_accuracy(lin.predictions == y_test, y_test), TEST_IMAGES),
                "rotation.mlp.acc": PerUnit(per_image_accuracy(mlp_pred == y_test, y_test), TEST_IMAGES)}
    return ProbeOutput({"rotation.acc": lin.metrics["linear.acc"],
                        "rotation.mlp.acc": (mlp_pred == y_test).double().mean().item()},
                       {"linear": lin.protocol, "mlp": {"hidden": mlp_hidden, "epochs": mlp_epochs,
                                                         "optimizer": "adam lr 1e-3, full batch", "standardize": True},
                        "chance": 0.25,
                        "rows": f"{len(y_test)} test rows from {n_images} test images (each at 0/90/180/270°) "
                                f"and {len(groups)} training rows from {len(groups) // 4} training images",
                        "validation": "C chosen on a validation split grouped by image (an image's 4 rotations "
                                      "are all on one side)",
                        "unit": "test images: an image's score is the mean correctness of its 4 rotations"},
                       per_unit)


def _mlp_probe(tap: TapData, hidden: int, epochs: int) -> torch.Tensor:
    """The MLP probe's predicted rotations of the rotated test rows: (4M,) int64 on the CPU (fixed epochs, no
    validation split to group)."""
    x, y = tap.rotated_train_x.float(), tap.rotated_train_y
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    g = torch.Generator().manual_seed(tap.seed)
    torch.manual_seed(int(torch.randint(2**31, (1,), generator=g)))
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 4))
    net = net.to(x.device)  # initialised on the CPU from the seed, so every device starts from the same weights
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, weight_decay=1e-4)
    xs = (x - mean) / std
    for _ in range(epochs):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xs), y).backward()
        opt.step()
    with torch.no_grad():
        return net((tap.rotated_test_x.float() - mean) / std).argmax(1).cpu()


def orbits(tap: TapData, sweeps: list[str] | None = None, n_images: int = 64, pca_images: int = 8) -> ProbeOutput:
    """Orbit geometry along each augmentation sweep (see `probes.orbits`), raw and scale-free, in the
    space the head was trained on (unnormalised taps); metrics are prefixed by the sweep name.

    `<sweep>.orbit.d_inter` and `.d_ratio` are the paper's (between class centroids, from `tap.orbit_labels`);
    they are absent when the tap has no orbit labels or the orbit images hold fewer than 2 classes, and the
    protocol's "centroids" sentence says so. `.d_inter_image` and `.d_ratio_image` compare image-orbit centroids
    and are always there."""
    from .orbit_intervals import orbit_statistics
    from .orbits import orbit_measures, orbit_pca, sweep_values

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
