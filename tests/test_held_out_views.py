"""The view probes measure held-out views: the test images' (augment.probe_views: test, the default), drawn from
their own augmentation stream, while the heads train on the training images' views (headprobe/pipeline/stages.py
`extract_features`, headprobe/pipeline/taps.py `tap_data`)."""

import pytest
import torch

from headprobe import run
from headprobe.backbones import load_backbone
from headprobe.data import load_data
from headprobe.data.augment import augment_spec
from headprobe.features.views import extract_views
from headprobe.pipeline.stages import held_out_view_seed
from headprobe.probes.builtin.invariance import INVARIANCE as invariance
from headprobe.probes.tap_data import TapData
from headprobe.recipe import RecipeError, load_recipe

pytestmark = pytest.mark.slow  # each test runs the pipeline end to end

HEAD = {"heads": [{"name": "relu", "width": 16}], "augment": {"preset": "crop-flip", "views": 2},
        "train": {"epochs": 1, "batch_size": 50}}
SMALL = {"source": "sklearn-digits", "limit": {"train": 100, "test": 40}}


def direct_views(recipe: dict, split: str, seed: int):
    """The views of one split by `extract_views` itself, uncached, from a backbone and data loaded afresh."""
    spec = load_recipe(recipe)
    backbone = load_backbone(spec.backbone.id, pooling=spec.backbone.pooling)
    data = load_data(spec.data)
    return extract_views(backbone, getattr(data, split), data_info=data.info, augment=augment_spec("crop-flip"),
                         views=2, seed=seed, batch_size=50, cache=False)


def align_of(views) -> float:
    n = len(views.features)
    empty, labels = torch.zeros(n, views.features.shape[-1]), torch.zeros(n, dtype=torch.int64)
    return invariance(TapData("backbone", empty, labels, empty, labels, 2, views=views.features)).metrics["align"]


def test_view_probes_measure_the_test_images_views_and_heads_train_on_the_training_views(tiny_recipe, tmp_path):
    recipe = {**tiny_recipe, **HEAD, "data": SMALL, "probes": {"invariance": {}}}
    results = run(recipe, out=tmp_path / "r", quiet=True)
    probed = results["protocol"]["views_probed"]
    assert probed["split"] == "test" and probed["n_images"] == 40 and probed["views"] == 2
    assert probed["heads_trained_on"] == "train" and probed["seed"] == held_out_view_seed(0) != 0
    assert results["protocol"]["views"]["cache_key"] != probed["cache_key"]
    assert results["taps"]["backbone"]["protocol"]["invariance"]["n_images"] == 40
    assert results["taps"]["relu"]["uncertainty"]["align"]["n_units"] == 40
    test_views = direct_views(recipe, "test", held_out_view_seed(0))
    assert results["taps"]["backbone"]["metrics"]["align"] == pytest.approx(align_of(test_views), rel=1e-6)
    train_views = direct_views(recipe, "train", 0)
    # Image i of the test set does not get the augmentation draws of training image i: its own stream.
    assert not torch.equal(test_views.params, train_views.params[:40])


def test_probe_views_train_keeps_the_training_views_and_the_value_is_checked(tiny_recipe, tmp_path):
    recipe = {**tiny_recipe, "data": SMALL, "augment": {"preset": "crop-flip", "views": 2, "probe_views": "train"},
              "probes": {"invariance": {}}}
    results = run(recipe, out=tmp_path / "r", quiet=True)
    probed = results["protocol"]["views_probed"]
    assert probed["split"] == "train" and probed["n_images"] == 100 and probed["seed"] == 0
    assert probed["heads_trained_on"] is None and probed["cache_key"] == results["protocol"]["views"]["cache_key"]
    assert results["taps"]["backbone"]["metrics"]["align"] == pytest.approx(
        align_of(direct_views(recipe, "train", 0)), rel=1e-6)
    with pytest.raises(RecipeError, match="probe_views"):
        load_recipe({**recipe, "augment": {"probe_views": "val"}})
