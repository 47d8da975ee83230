"""Probes that score representations: class information (linear, k-NN), information between views
(MI bounds, Gaussian MI), and invariance/spectrum measures (alignment, uniformity, RankMe, LiDAR, α-ReQ).

These are the estimators; the probes a recipe names are declared one module each in `probes.builtin`
(`probes.declaration`: what a probe declares about itself and its metrics)."""

from headprobe.probes.information import (
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
from headprobe.probes.knn import KnnResult, knn
from headprobe.probes.label_mi import label_mi_lower_bound
from headprobe.probes.linear import LinearProbeResult, linear_probe
from headprobe.probes.logistic import fit_logistic
from headprobe.probes.spectrum import (
    alignment,
    alpha_req,
    covariance_spectrum,
    lidar,
    rankme,
    uniformity,
    view_cosine,
)

__all__ = [
    "KnnResult", "LinearProbeResult", "SeparableCritic", "alignment", "alpha_req", "cosine_critic",
    "covariance_spectrum", "dv_bound", "fit_logistic", "gaussian_mi", "infonce_bound", "knn",
    "label_mi_lower_bound", "lidar", "linear_probe", "mutual_information", "nwj_bound", "rankme",
    "smile_bound", "train_critic", "uniformity", "view_cosine",
]
