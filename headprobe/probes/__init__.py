"""Probes that score representations: class information (linear, k-NN), information between views
(MI bounds, Gaussian MI), and invariance/spectrum measures (alignment, uniformity, RankMe, LiDAR, α-ReQ).

These are the estimators; the probes a recipe names are declared one module each in `probes.builtin`
(`probes.declaration`: what a probe declares about itself and its metrics).

The names below are imported on first use, so that reading a probe's declaration (`headprobe list`, `validate`)
never imports torch. `knn` is the function, not the module `probes/knn.py`, whether or not that module was
imported first (`_Package`)."""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING

_LAZY = {
    "SeparableCritic": "information", "cosine_critic": "information", "dv_bound": "information",
    "gaussian_mi": "information", "infonce_bound": "information", "mutual_information": "information",
    "nwj_bound": "information", "smile_bound": "information", "train_critic": "information",
    "KnnResult": "knn", "knn": "knn",
    "label_mi_lower_bound": "label_mi",
    "LinearProbeResult": "linear", "linear_probe": "linear",
    "fit_logistic": "logistic",
    "alignment": "view_geometry", "alpha_req": "spectrum", "covariance_spectrum": "spectrum", "lidar": "spectrum",
    "rankme": "spectrum", "uniformity": "view_geometry", "view_cosine": "view_geometry",
}

if TYPE_CHECKING:  # pragma: no cover
    from headprobe.probes.information import (  # noqa: F401
        SeparableCritic,
        cosine_critic,
        dv_bound,
        gaussian_mi,
        infonce_bound,
        mutual_information,
        nwj_bound,
        smile_bound,
        train_critic,
    )
    from headprobe.probes.knn import KnnResult, knn  # noqa: F401
    from headprobe.probes.label_mi import label_mi_lower_bound  # noqa: F401
    from headprobe.probes.linear import LinearProbeResult, linear_probe  # noqa: F401
    from headprobe.probes.logistic import fit_logistic  # noqa: F401
    from headprobe.probes.spectrum import alpha_req, covariance_spectrum, lidar, rankme  # noqa: F401
    from headprobe.probes.view_geometry import alignment, uniformity, view_cosine  # noqa: F401


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


class _Package(types.ModuleType):
    """Importing the sub-module `probes.knn` would bind the package's `knn` to that module (the import system sets
    a package's attribute to each sub-module it loads); the public name stays the function."""

    def __setattr__(self, name: str, value) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = sorted(_LAZY)
