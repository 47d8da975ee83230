"""Loss geometry: Hessian spectra w.r.t. parameters or representations (Lanczos, SLQ, exact blocks), the pull-back
metric and effective Hessian of a head, and curvature snapshots for tracking collapse during training."""

from headprobe.geometry.collapse import collapse_start
from headprobe.geometry.density import hutchinson_trace, slq_density, smoothed_density
from headprobe.geometry.effective import effective_hessian, whitening
from headprobe.geometry.eigs import dense_hessian, hessian_eigs, per_sample_blocks, per_sample_spectrum
from headprobe.geometry.hessian import HessianVectorProduct, LanczosResult, hvp_fn, lanczos
from headprobe.geometry.power import PowerIterationResult, power_iteration
from headprobe.geometry.pullback import augmentation_degeneracy, batchnorm_mode, head_jacobian, pullback_metric
from headprobe.geometry.tracking import curvature_snapshot, symmetric_simsiam

__all__ = [
    "HessianVectorProduct",
    "LanczosResult",
    "PowerIterationResult",
    "augmentation_degeneracy",
    "batchnorm_mode",
    "collapse_start",
    "curvature_snapshot",
    "dense_hessian",
    "effective_hessian",
    "head_jacobian",
    "hessian_eigs",
    "hutchinson_trace",
    "hvp_fn",
    "lanczos",
    "per_sample_blocks",
    "per_sample_spectrum",
    "power_iteration",
    "pullback_metric",
    "slq_density",
    "smoothed_density",
    "symmetric_simsiam",
    "whitening",
]
