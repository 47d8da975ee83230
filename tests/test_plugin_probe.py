"""A new probe is one function plus one registry entry, from outside the package, and runs through a recipe."""

from dataclasses import dataclass

import pytest
import torch

from headprobe import run
from headprobe.probes.tap_data import ProbeOutput
from headprobe.recipe import RecipeError
from headprobe.registry import PROBES
from headprobe.stats.bootstrap import TEST_IMAGES, PerUnit


@dataclass
class NearestCentroidSpec:
    shrink: float = 0.0


def nearest_centroid(tap, shrink: float = 0.0) -> ProbeOutput:
    """Test accuracy of the nearest class mean (a toy probe), with its per-image values for an interval, and the
    number of augmented views it saw (it declares that it needs them)."""
    means = torch.stack([tap.train_x[tap.train_y == c].mean(0) for c in range(tap.n_classes)]) * (1 - shrink)
    correct = (torch.cdist(tap.test_x.float(), means.float()).argmin(1) == tap.test_y).double()
    return ProbeOutput({"centroid.acc": float(correct.mean()), "centroid.views": float(tap.views.shape[1])},
                       {"shrink": shrink}, {"centroid.acc": PerUnit(correct, TEST_IMAGES)})


@pytest.fixture
def registered():
    PROBES.add("nearest_centroid", f"{__name__}:nearest_centroid", "nearest class mean (a test plug-in)",
               needs=("views",), options=f"{__name__}:NearestCentroidSpec")
    yield
    PROBES.remove("nearest_centroid")


@pytest.mark.slow
def test_a_probe_registered_from_outside_runs_through_a_recipe(tiny_recipe, tmp_path, registered):
    recipe = {**tiny_recipe, "augment": {"preset": "crop-flip", "views": 3},
              "probes": {"nearest_centroid": {"shrink": 0.1}}, "report": False}
    results = run(recipe, out=tmp_path / "r", quiet=True)
    tap = results["taps"]["backbone"]
    assert 0.0 <= tap["metrics"]["centroid.acc"] <= 1.0
    assert tap["metrics"]["centroid.views"] == 3.0  # the views it declared were extracted for it alone
    assert tap["protocol"]["nearest_centroid"] == {"shrink": 0.1}
    low, high = tap["uncertainty"]["centroid.acc"]["ci95"]
    assert low <= tap["metrics"]["centroid.acc"] <= high
    with pytest.raises(RecipeError, match="shrinkage"):
        run({**recipe, "probes": {"nearest_centroid": {"shrinkage": 0.1}}}, out=tmp_path / "bad", quiet=True)


def test_a_registered_probe_must_name_inputs_that_exist():
    with pytest.raises(ValueError, match="needs \\['depth_maps'\\]"):
        PROBES.add("bad", f"{__name__}:nearest_centroid", "x", needs=("depth_maps",))
    assert "bad" not in PROBES
