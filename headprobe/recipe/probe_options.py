"""The options of the built-in probes (`probes.<name>` in a recipe): each field's default, range and registry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..registry import ORBIT_SWEEPS
from .fields import FRACTION, POSITIVE, at_least, registered


@dataclass
class LinearProbeSpec:
    C_grid: list[float] = field(default_factory=lambda: [10.0**k for k in range(-4, 4)], metadata=POSITIVE)
    standardize: bool = True
    max_iter: int = field(default=1000, metadata=at_least(1))
    # At scikit-learn's default 1e-4 the answer depends on where each fit starts: on the quickstart's backbone,
    # the path-warm-started fits at large C already meet it at their start, so C = 100 won (linear.acc 0.973)
    # where sklearn from zero picks C = 1 (0.980). At 1e-6 headprobe and sklearn agree on every validation
    # accuracy, the C and the test accuracy; it costs ~0.3 s per tap there, against 0.21 s at 1e-4.
    tol: float = field(default=1e-6, metadata=POSITIVE)


@dataclass
class KnnSpec:
    ks: list[int] = field(default_factory=lambda: [10, 20, 100, 200], metadata=at_least(1))
    temperature: float = field(default=0.07, metadata=POSITIVE)
    weighting: Literal["exp", "uniform"] = "exp"
    # Test queries per similarity block: memory only (O(chunk_size × N)), never the predictions.
    chunk_size: int = field(default=256, metadata=at_least(1))
    # With several processes: true = each searches 1/W of the training bank and the partial top-k lists are merged
    # (DINOv2's sharded k-NN; the same predictions); false = each tap's whole k-NN runs on one process; null =
    # shard from 65,536 training rows (probe_sharing.SHARD_BANK_ROWS), below which one process's k-NN is cheaper.
    shard_bank: bool | None = None


@dataclass
class SpectrumSpec:
    # Condition number on the top-k eigenvalues; null = decided from samples vs dimension.
    top_k: int | None = field(default=None, metadata=at_least(1))


@dataclass
class InvarianceSpec:
    uniformity_t: float = field(default=2.0, metadata=POSITIVE)


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


@dataclass
class AugmentR2Spec:
    # Ridge penalties tried per parameter (None: 1e-3 … 1e6, half-decade steps).
    alphas: list[float] | None = field(default=None, metadata=POSITIVE)
    # Cross-validation folds on the training images that choose each parameter's penalty (2 at least).
    folds: int = field(default=5, metadata=at_least(2))
    test_fraction: float = field(default=0.25, metadata=FRACTION)


@dataclass
class RotationSpec:
    C_grid: list[float] | None = field(default=None, metadata=POSITIVE)
    mlp_hidden: int = field(default=256, metadata=at_least(1))
    mlp_epochs: int = field(default=100, metadata=at_least(1))


@dataclass
class OrbitSpec:
    # The sweeps whose orbits the pipeline extracts (the probe measures every orbit it is given).
    sweeps: list[str] = field(default_factory=lambda: ["rotation45", "rotation360"], metadata=registered(ORBIT_SWEEPS))
    n_images: int = field(default=64, metadata=at_least(1))
    pca_images: int = field(default=8, metadata=at_least(1))


PROBE_SPECS: dict[str, type] = {
    "linear": LinearProbeSpec, "knn": KnnSpec, "spectrum": SpectrumSpec, "invariance": InvarianceSpec,
    "view_mi": ViewMISpec, "augment_r2": AugmentR2Spec, "rotation": RotationSpec, "orbits": OrbitSpec,
}


@dataclass
class NoOptions:
    """The options of a plug-in registered without an options class: none."""
