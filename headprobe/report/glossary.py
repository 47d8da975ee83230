"""What each metric of a run means: a sentence, its unit, which way is "more", and its chance level.

The report's glossary section and the tooltips on metric names read `describe_metric`; the metric table and the
heat-map leave out what `is_protocol_value` names (hyper-parameters chosen on validation data and ceilings: they
say how a number was obtained, not what the tap holds), which go to a table of their own.

>>> describe_metric("knn.k20.acc", n_classes=10).chance
0.1
>>> describe_metric("rotation.acc").chance
0.25
>>> is_protocol_value("linear.C"), is_protocol_value("linear.acc")
(True, False)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["MetricInfo", "describe_metric", "is_protocol_value", "metric_unit", "tooltip"]

# Metric-name endings that are protocol values (a chosen hyper-parameter, a validation score, a ceiling).
PROTOCOL_SUFFIXES = ("C", "ceiling", "val_acc")


@dataclass(frozen=True)
class MetricInfo:
    """meaning: one sentence; unit: what the number counts; direction: what a higher value says; chance: the value
    with no information (None where there is no such level, e.g. ranks); note: how to read it (e.g. a caveat)."""

    meaning: str
    unit: str
    direction: str
    chance: float | None = None
    note: str = ""


def is_protocol_value(metric: str) -> bool:
    """True for protocol values recorded among the metrics: `linear.C`, `linear.val_acc`, `mi.infonce.ceiling`."""
    return metric.rsplit(".", 1)[-1] in PROTOCOL_SUFFIXES


def _class_chance(n_classes) -> float | None:
    return 1 / n_classes if isinstance(n_classes, int) and n_classes > 0 else None


def _fixed(metric: str, n_classes) -> MetricInfo | None:
    chance = _class_chance(n_classes)
    info = {
        "linear.acc": MetricInfo("test accuracy of a linear probe (logistic regression, C chosen on a validation "
                                 "split of train) predicting the class", "fraction of test images",
                                 "higher = more class information", chance),
        "linear.val_acc": MetricInfo("validation accuracy of the linear probe at the chosen C (protocol)",
                                     "fraction of validation images", "used to choose C; not a measurement", chance),
        "linear.C": MetricInfo("inverse L2 strength of the linear probe, chosen on validation (protocol)",
                               "1/regularisation", "a setting, not a measurement"),
        "mi.label": MetricInfo("lower bound on the mutual information between the tap and the class label, from "
                               "the linear probe's held-out log-likelihood", "nats (at most log n_classes)",
                               "higher = more class information", 0.0),
        "rotation.acc": MetricInfo("test accuracy of a linear probe predicting the image's rotation "
                                   "(0/90/180/270°)", "fraction of test rows (4 per image)",
                                   "higher = more orientation information (less invariance)", 0.25),
        "rotation.mlp.acc": MetricInfo("test accuracy of a small MLP predicting the image's rotation",
                                       "fraction of test rows (4 per image)",
                                       "higher = more orientation information (less invariance)", 0.25),
        "aug_r2.mean": MetricInfo("R² of ridge regressions predicting the augmentation parameters of a view, "
                                  "averaged over parameters", "R² (1 = exact, 0 = the mean's guess)",
                                  "higher = more augmentation information (less invariance)", 0.0),
        "align": MetricInfo("mean squared distance between two views of an image, L2-normalised (Wang & Isola)",
                            "squared distance on the unit sphere, in [0, 4]",
                            "lower = views closer; raw: moves with the spread of the whole cloud (a description)"),
        "view_cos": MetricInfo("mean cosine between two views of an image", "cosine, in [−1, 1]",
                               "higher = views closer; raw: moves with the spread of the whole cloud "
                               "(a description)"),
        "view_spread_rel": MetricInfo("spread of an image's views around their centroid over the distance between "
                                      "views of different images, in the tap's own space", "ratio (scale-free)",
                                      "lower = more invariance to the augmentations"),
        "uniform": MetricInfo("log of the mean Gaussian potential between L2-normalised features (Wang & Isola)",
                              "log potential, ≤ 0", "lower = spread more uniformly on the sphere"),
        "lidar": MetricInfo("LiDAR: effective rank of the linear discriminant of images by their views",
                            "effective rank (dims)", "higher = more distinguishable directions"),
        "rankme": MetricInfo("RankMe: exp-entropy of the normalised singular values of the features",
                             "effective rank (dims)", "higher = more dimensions used (1 = collapse)"),
        "eff_rank": MetricInfo("effective rank of the feature covariance", "effective rank (dims)",
                               "higher = more dimensions used"),
        "alpha_req": MetricInfo("α-ReQ: power-law exponent of the covariance eigenvalue decay", "exponent",
                                "higher = faster decay (fewer effective dimensions); ≈ 1 is typical of good "
                                "features"),
        "cond": MetricInfo("condition number of the feature covariance (largest over smallest eigenvalue kept)",
                           "ratio", "higher = more anisotropic"),
        "mi.infonce": MetricInfo("InfoNCE lower bound on the mutual information between two views",
                                 "nats (at most log batch size)", "higher = views more predictable from each other "
                                 "(more invariance)", 0.0,
                                 "≤ 0: the critic does no better than chance here (critic uninformative), not "
                                 "evidence"),
        "mi.infonce.ceiling": MetricInfo("log of the InfoNCE batch size: the largest value the bound can reach "
                                         "(protocol)", "nats", "a ceiling, not a measurement"),
        "mi.gaussian": MetricInfo("mutual information between two views under a Gaussian model (CCA on a PCA)",
                                  "nats", "higher = views more predictable (depends on the PCA width: a "
                                  "description)", 0.0),
    }
    return info.get(metric)


ORBIT = {
    "spread_rel": MetricInfo("spread of an image's orbit around its centroid over random pairs' squared distance",
                             "ratio in [0, 1/2] (scale-free)", "lower = more invariance along the sweep", 0.5,
                             "1/2 (the chance level shown) = orbits as wide as the whole cloud"),
    "spread": MetricInfo("mean squared distance of an orbit's points to its centroid", "squared distance (the "
                         "tap's units)", "lower = more invariance, but scale-dependent (a description)"),
    "curvature": MetricInfo("mean turning of an orbit's trajectory on the unit sphere", "radians per step",
                            "higher = more bent trajectories"),
    "d_ratio": MetricInfo("the paper's D_inter / D_intra: class-centroid distance over within-orbit distance",
                          "ratio", "higher = classes further apart than an orbit is wide"),
    "d_inter": MetricInfo("the paper's D_inter: mean distance between class centroids", "distance (tap's units)",
                          "higher = classes further apart (scale-dependent)"),
    "d_intra": MetricInfo("the paper's D_intra: mean distance within one image's orbit", "distance (tap's units)",
                          "lower = more invariance (scale-dependent)"),
    "d_ratio_image": MetricInfo("image-centroid distance over within-orbit distance (not the paper's)", "ratio",
                                "higher = images further apart than an orbit is wide"),
    "d_inter_image": MetricInfo("mean distance between image-orbit centroids (not the paper's)",
                                "distance (tap's units)", "higher = images further apart (scale-dependent)"),
    "d_intra_rel": MetricInfo("D_intra over random pairs' distance", "ratio (scale-free)",
                              "lower = more invariance along the sweep"),
    "cos_anchor": MetricInfo("mean cosine between an orbit's points and its unchanged image", "cosine, in [−1, 1]",
                             "higher = more invariance along the sweep"),
    "eff_rank": MetricInfo("effective rank of an orbit's centred points", "effective rank (dims)",
                           "higher = the orbit spans more directions"),
    "pair_sq_dist": MetricInfo("mean squared distance between points of different images: the space's scale",
                               "squared distance (tap's units)", "a scale, not invariance"),
    "pair_dist": MetricInfo("mean distance between points of different images: the space's scale",
                            "distance (tap's units)", "a scale, not invariance"),
}
KNN = re.compile(r"knn\.k(\d+)\.acc")


def describe_metric(metric: str, n_classes: int | None = None) -> MetricInfo | None:
    """What `metric` means, or None for a name this glossary does not know. n_classes sets the chance level of
    class accuracies (1/n_classes)."""
    info = _fixed(metric, n_classes)
    if info is not None:
        return info
    if match := KNN.fullmatch(metric):
        return MetricInfo(f"test accuracy of a weighted {match.group(1)}-nearest-neighbour vote (cosine, train "
                          "images as the neighbours)", "fraction of test images", "higher = more class information",
                          _class_chance(n_classes))
    if ".orbit." in metric or metric.startswith("orbit."):
        sweep, _, measure = metric.rpartition("orbit.")
        base = ORBIT.get(measure)
        if base is None:
            return None
        where = f" ({sweep.rstrip('.')} sweep)" if sweep else ""
        return MetricInfo(base.meaning + where, base.unit, base.direction, base.chance, base.note)
    if metric.startswith("aug_r2."):
        name = metric.split(".", 1)[1]
        return MetricInfo(f"R² of a ridge regression predicting the augmentation parameter {name!r} of a view",
                          "R² (1 = exact, 0 = the mean's guess)",
                          "higher = more information about it (less invariance; a description)", 0.0)
    return None


def metric_unit(metric: str) -> str:
    """The unit of `metric` for an axis label; "value" when the glossary does not know it."""
    info = describe_metric(metric)
    return info.unit if info is not None else "value"


def tooltip(metric: str, n_classes: int | None = None) -> str:
    """One line for a title attribute: meaning; unit; direction; chance."""
    info = describe_metric(metric, n_classes)
    if info is None:
        return f"{metric}: not in the glossary (see the probe's docstring)"
    chance = f"; chance {info.chance:g}" if info.chance is not None else ""
    note = f"; {info.note}" if info.note else ""
    return f"{metric}: {info.meaning}; unit: {info.unit}; {info.direction}{chance}{note}"

