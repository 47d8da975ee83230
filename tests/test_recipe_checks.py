"""recipe.checks: what relates fields to each other, checked before anything loads."""

import pytest
import yaml

from headprobe.recipe import RecipeError, load_recipe
from headprobe.recipe.checks import declared_shape

HEADS = {"heads": [{"name": "relu", "width": 16}], "augment": {"preset": "crop-flip", "views": 2}}


def test_orbit_sweeps_are_checked_against_the_known_sweeps():
    from headprobe.probes.orbits import ORBIT_SWEEPS

    with pytest.raises(RecipeError, match=r"probes\.orbits\.sweeps\[0\] = 'rotation46': unknown orbit sweep.*"
                                          r"allowed: .*rotation45.*Did you mean 'rotation45'"):
        load_recipe({"probes": {"orbits": {"sweeps": ["rotation46"]}}})
    with pytest.raises(RecipeError, match=r"probes\.orbits\.sweeps is empty"):
        load_recipe({"probes": {"orbits": {"sweeps": []}}})
    assert load_recipe({"probes": {"orbits": {"sweeps": list(ORBIT_SWEEPS)}}}).probes["orbits"].sweeps == list(
        ORBIT_SWEEPS)


@pytest.mark.parametrize("value", [0, 0.0, 1, -0.1])
def test_test_fraction_excludes_0_and_1(value):
    with pytest.raises(RecipeError, match=r"data\.test_fraction = .* is out of range; it must be in \(0, 1\)"):
        load_recipe({}, [f"data.test_fraction={value}"])
    assert load_recipe({}, ["data.test_fraction=0.1"]).data.test_fraction == 0.1


def test_limit_train_below_batch_size_is_refused_when_heads_train():
    with pytest.raises(RecipeError, match=r"train\.batch_size = 256 is larger than the 200 training images of "
                                          r"data\.limit\.train = 200; lower train\.batch_size to at most 200 or "
                                          r"raise data\.limit\.train to at least 256"):
        load_recipe(HEADS, ["data.limit.train=200"])
    # the run's rule is n < batch_size: equal is fine; no heads, nothing trains; tuned backbones train too
    assert load_recipe(HEADS, ["data.limit.train=256"]).data.limit.train == 256
    assert load_recipe({}, ["data.limit.train=200"]).data.limit.train == 200
    with pytest.raises(RecipeError, match="train.batch_size = 64 is larger than the 50 training images"):
        load_recipe({**HEADS, "backbone": {"id": "scratch:vit-tiny", "tune": "full"}},
                    ["data.limit.train=50", "train.batch_size=64"])
    with pytest.raises(RecipeError, match="sweep combination batch_size=300: train.batch_size = 300"):
        load_recipe({**HEADS, "data": {"limit": {"train": 256}}, "sweep": {"train.batch_size": [128, 300]}})


@pytest.mark.parametrize("name", ["../../escape", "a/b", "..", ".hidden", "", "a b", "x\\y", "a" * 129])
def test_unsafe_names_are_refused(name):
    with pytest.raises(RecipeError, match=r"name = .* is not allowed: .*must match \[A-Za-z0-9\]"):
        load_recipe({"name": name})


def test_safe_names_and_file_stems(tmp_path):
    assert load_recipe({"name": "My_study-2.v1"}).name == "My_study-2.v1"
    path = tmp_path / "my study (copy).yaml"
    path.write_text(yaml.safe_dump({"seed": 1}))
    assert load_recipe(path).name == "my_study_copy_"  # the default name is made safe, not refused


def test_known_block_counts_and_patch_sizes_match_the_models():
    from headprobe.backbones import load_backbone

    backbone = load_backbone("scratch:vit-tiny", pooling="cls")
    assert len(backbone.blocks) == declared_shape("scratch:vit-tiny")["blocks"]
    assert declared_shape("scratch:vit-tiny")["patch"] == 4
    assert len(load_backbone("scratch:resnet18-cifar").blocks) == declared_shape("scratch:resnet18-cifar")["blocks"]
    assert declared_shape("timm:vit_small_patch16_224") == {"patch": 16}
    assert declared_shape("open_clip:ViT-B-32/openai") == {"patch": 32}
    assert declared_shape("hf:facebook/dinov2-small") == {}
    with pytest.raises(ValueError, match="layer 3 is out of range; this model has 3 blocks"):
        load_backbone("scratch:vit-tiny", pooling="cls", layer=3)


def test_options_are_checked_without_heads_and_head_settings_without_heads_warn():
    import warnings

    with pytest.raises(RecipeError, match="objective.options.foo"):
        load_recipe({"heads": []}, ["objective.options.foo=1"])
    with pytest.raises(RecipeError, match="augment: "):
        load_recipe({"heads": []}, ["augment.options.nonsense=1"])
    with pytest.warns(UserWarning, match=r"geometry.final and train.checkpoint_every have no effect without heads"):
        load_recipe({"heads": []}, ["geometry.final=true", "train.checkpoint_every=2"])
    with pytest.warns(UserWarning, match=r"^train.checkpoint_every has no effect without heads"):
        load_recipe({"heads": []}, ["train.checkpoint_every=2"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_recipe({"heads": [{"name": "relu", "width": 16}], "augment": {"preset": "crop-flip", "views": 2}},
                    ["geometry.final=true", "train.checkpoint_every=2"])
        load_recipe({"heads": []})


@pytest.mark.parametrize("objective", ["info_nce", "vicreg", "barlow_twins", "simsiam"])
def test_objective_options_are_read_from_the_source_as_the_signature_has_them(objective, monkeypatch):
    """The recipe check reads an objective's options from its module's source (no torch import); they are the
    names `inspect.signature` gives the imported function."""
    import inspect
    import sys

    from headprobe.registry import OBJECTIVES

    skipped = {"p1", "p2", "z1", "z2", "gather_distributed"}
    expected = [p for p in list(inspect.signature(OBJECTIVES.get(objective)).parameters)[2:] if p not in skipped]
    monkeypatch.delitem(sys.modules, "headprobe.train.objectives")  # as in a fresh `validate`: read from source
    with pytest.raises(RecipeError) as caught:
        load_recipe({"heads": [], "objective": {"name": objective}}, ["objective.options.no_such_option=1"])
    allowed = str(caught.value).split("allowed: ", 1)[1].split(".")[0]
    assert [a for a in allowed.split(", ") if a] == expected
