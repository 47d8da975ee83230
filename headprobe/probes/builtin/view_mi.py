"""The view_mi probe: mutual information between two views of an image, by InfoNCE (with its log B ceiling) and by
a Gaussian (CCA) closed form on the top principal components."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from headprobe.registry import POSITIVE, at_least

from ..declaration import CHUNKS, INVARIANCE, PROTOCOL, Metric, Probe
from ..tap_data import ProbeOutput, TapData, need_views


@dataclass
class ViewMISpec:
    # InfoNCE needs negatives: a batch of at least 2 pairs (probes.information.mutual_information).
    batch_size: int = field(default=128, metadata=at_least(2))
    temperature: float = field(default=0.1, metadata=POSITIVE)
    pca_dims: int = field(default=32, metadata=at_least(1))
    # InfoNCE critic: the fixed cosine/temperature one, or a separable (linear + MLP) critic trained on half the
    # pairs, early-stopped on a quarter of those, and evaluated on the other half; critic_steps is its maximum.
    critic: Literal["cosine", "separable"] = "cosine"
    critic_steps: int = field(default=1000, metadata=at_least(1))


def measure_view_mi(tap: TapData, *, batch_size: int, temperature: float, pca_dims: int, critic: str,
                    critic_steps: int, chunk_rows: int | None = None) -> ProbeOutput:
    """MI between two views of an image: InfoNCE (ceiling log B) with the fixed cosine critic or a trained
    separable critic (held-out pairs), and the Gaussian (CCA) closed form on the top k = min(pca_dims, D, N//10)
    principal components, fitted on the views themselves. The Gaussian value is the plug-in minus its exact
    small-sample bias for Gaussian data, without shrinkage (`gaussian_mi`): k ≤ N/10 keeps the joint 2k×2k
    correlation matrix invertible, and shrinking it would erase the cross-view correlation that is the MI.

    The two views are read in blocks: InfoNCE's batches with the cosine critic (the separable critic's training
    and held-out pairs are held whole), the principal axes at most `chunk_rows` rows at a time (default
    `spectrum.CHUNK_ROWS`; `spectrum.principal_axes`), and the projections onto them block by block, so beside
    the views only the (N, k) projections are held."""
    import math

    import torch

    from headprobe.stats.bootstrap import VIEW_IMAGES, Linearised

    from .. import spectrum
    from ..influence import gaussian_mi_per_pair
    from ..information import gaussian_mi, mutual_information

    views = need_views(tap, "view_mi")
    z1, z2 = views.select(1, 0), views.select(1, 1)  # views[:, 0], read lazily where the tap is read by rows
    batch = min(batch_size, len(z1))
    options = {"temperature": temperature} if critic == "cosine" else {"steps": critic_steps}
    nce = mutual_information(z1, z2, method="infonce", critic=critic, batch_size=batch, seed=tap.seed,
                             dtype=torch.float64, **options)
    k = min(pca_dims, z1.shape[1], len(z1) // 10 or 1)
    chunk_rows = spectrum.CHUNK_ROWS if chunk_rows is None else chunk_rows
    mean, vh = spectrum.principal_axes([z1, z2], chunk_rows)
    basis = vh[:k].T

    def project(z: torch.Tensor) -> torch.Tensor:
        """(N, D) -> (N, k) float64 scores on the principal axes, `chunk_rows` rows at a time."""
        return torch.cat([(z[start : start + chunk_rows].double() - mean) @ basis
                          for start in range(0, len(z), chunk_rows)])

    x1, x2 = project(z1), project(z2)
    gauss = gaussian_mi(x1, x2, shrinkage=None, bias_correction=True)
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
        values = gaussian_mi_per_pair(x1, x2, gauss["mi"])
        per_unit["mi.gaussian"] = Linearised(values.cpu(), VIEW_IMAGES)
    return ProbeOutput(metrics, protocol, per_unit)


VIEW_MI = Probe(
    "view_mi", measure_view_mi,
    "MI between two views: InfoNCE (cosine critic, with its log B ceiling) and Gaussian/CCA",
    options=ViewMISpec, needs=("views",), reads=CHUNKS,
    reads_why="blocks of images and InfoNCE batches; holds the (N_v, k) principal scores, and with critic: "
              "separable the critic's training and held-out pairs",
    cost=1.3, cost_source="benchmarks/results/probe_costs.json",
    metrics=(
        Metric("mi.infonce", "InfoNCE lower bound on the mutual information between two views",
               "nats (at most log batch size)", "higher = views more predictable from each other (more invariance)",
               0.0, "≤ 0: the critic does no better than chance here (critic uninformative), not evidence",
               role=INVARIANCE, predicted=+1, headline=9),
        Metric("mi.infonce.ceiling", "log of the InfoNCE batch size: the largest value the bound can reach "
               "(protocol)", "nats", "a ceiling, not a measurement", role=PROTOCOL),
        # The verdict's piece of evidence for InfoNCE (`stats.verdict`): the bound relative to its ceiling, counted
        # only where both taps' InfoNCE is > 0.
        Metric("mi.infonce/ceiling", "InfoNCE over its ceiling log B (the buffer verdict's piece for mi.infonce)",
               "fraction of the ceiling", "higher = views more predictable from each other (more invariance)", 0.0,
               role=INVARIANCE, predicted=+1),
        Metric("mi.gaussian", "mutual information between two views under a Gaussian model (CCA on a PCA)", "nats",
               "higher = views more predictable (depends on the PCA width: a description)", 0.0),
    ),
)
