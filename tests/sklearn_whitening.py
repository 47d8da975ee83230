"""An independent reference for the linear probe's whitening (headprobe.probes.whitening), from scikit-learn."""

import numpy as np
from sklearn.decomposition import PCA


class Whitener:
    """sklearn's PCA whitening fitted on all of train, rescaled to unit variance with 1/N (PCA divides by N − 1)."""

    def __init__(self, x: np.ndarray):
        self.pca, self.scale = PCA(whiten=True).fit(x), np.sqrt(len(x) / (len(x) - 1))

    def transform(self, rows: np.ndarray) -> np.ndarray:
        return self.pca.transform(rows) * self.scale
