"""Probes that score frozen features: weighted kNN and a logistic-regression linear probe."""

from headprobe.probes.knn import KnnResult, knn
from headprobe.probes.linear import LinearProbeResult, fit_logistic, linear_probe

__all__ = ["KnnResult", "LinearProbeResult", "fit_logistic", "knn", "linear_probe"]
