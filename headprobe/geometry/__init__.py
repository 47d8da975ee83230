"""Loss geometry: Hessian spectra w.r.t. parameters or representations (Lanczos, SLQ, exact blocks)."""

from headprobe.geometry.hessian import (
    HessianVectorProduct,
    LanczosResult,
    PowerIterationResult,
    dense_hessian,
    hessian_eigs,
    hutchinson_trace,
    hvp_fn,
    lanczos,
    per_sample_blocks,
    per_sample_spectrum,
    power_iteration,
    slq_density,
    smoothed_density,
)

__all__ = [
    "HessianVectorProduct",
    "LanczosResult",
    "PowerIterationResult",
    "dense_hessian",
    "hessian_eigs",
    "hutchinson_trace",
    "hvp_fn",
    "lanczos",
    "per_sample_blocks",
    "per_sample_spectrum",
    "power_iteration",
    "slq_density",
    "smoothed_density",
]
