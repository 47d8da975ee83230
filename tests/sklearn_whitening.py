"""An independent reference for the linear probe's whitening (headprobe.probes.whitening), from scikit-learn."""

import numpy as np
from sklearn.decomposition import PCA


class Whitener:
    """sklearn's PCA whitening fitted on all of train, rescaled to unit variance with 1/N (PCA divides by N − 1);
    `n_components`: the rank, where it is below min(N, D)."""

    def __init__(self, x: np.ndarray, n_components: int | None = None):
        self.pca = PCA(n_components=n_components, whiten=True).fit(x)
        self.scale = np.sqrt(len(x) / (len(x) - 1))

    def transform(self, rows: np.ndarray) -> np.ndarray:
        return self.pca.transform(rows) * self.scale
