"""augment_r2 against scikit-learn's formulation of the same protocol (benchmarks/bench_augment_r2.py's baseline:
GridSearchCV over StandardScaler + Ridge per parameter, the probe's grouped folds and pooled-error rule), on a
ReLU tap with dead units: the same penalties and the same held-out R²."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from headprobe.probes.builtin.augment_r2 import AUGMENT_R2 as augment_r2
from headprobe.probes.tap_data import TapData

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

pytestmark = pytest.mark.usefixtures("single_thread")


def test_augment_r2_equals_sklearn_grid_search_on_the_same_folds(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_augment_r2 as bench

    views, params = bench.relu_views(n_images=60, views=4, dim=48, seed=2)
    grid = [1e-2, 1.0, 10.0, 100.0, 1e4]
    empty, labels = torch.zeros(2, 48), torch.zeros(2, dtype=torch.long)
    out = augment_r2(TapData("relu", empty, labels, empty, labels, 2, views=views, view_params=params), alphas=grid)
    reference = bench.sklearn_augment_r2(views, params, alphas=grid)
    assert out.protocol["params"] == list(reference)  # every parameter varies here
    assert len({out.protocol["alpha"][name] for name in reference}) > 1, "the choice must differ between parameters"
    for name, (alpha, r2) in reference.items():
        assert out.protocol["alpha"][name] == alpha, name
        assert out.metrics[f"aug_r2.{name}"] == pytest.approx(r2, abs=1e-9), name
