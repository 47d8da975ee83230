"""backbone.* recipe keys (layer(s), tune, lora) are checked before loading; load_backbone rejects unknown options."""

import pytest

from headprobe.backbones import load_backbone
from headprobe.recipe import RecipeError, load_recipe

HEAD = {"heads": [{"name": "h"}]}  # tuning trains the backbone through a head


def test_tuning_and_layer_keys_are_read():
    recipe = load_recipe(HEAD, ["backbone.id=scratch:vit-tiny", "backbone.tune=lora", "backbone.lora.r=4",
                              "backbone.layers=[-2, -1]", "backbone.lora.target_modules=[qkv]"])
    spec = recipe.backbone
    assert (spec.tune, spec.lora.r, spec.lora.alpha, spec.layers, spec.layer) == ("lora", 4, 16.0, [-2, -1], -1)
    assert load_recipe(HEAD, ["backbone.tune=last:2"]).backbone.tune == "last:2"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (["backbone.tune=last"], r"backbone.tune = 'last' is not allowed; allowed: frozen, last:N .*'last:1'"),
        (["backbone.tune=lroa"], r"Did you mean 'lora'"),
        (["backbone.lora.r=4"], r"backbone.lora is set but backbone.tune = 'frozen'"),
        (["backbone.tune=lora", "backbone.lora.dropout=1.0"], r"backbone.lora.dropout = 1.0 is out of range"),
        (["backbone.tune=lora", "backbone.lora.rank=4"], r"'backbone.lora.rank'; allowed keys here: r, alpha"),
        (["backbone.layers=[]"], r"backbone.layers is empty"),
        (["backbone.layer=3", "backbone.layers=[1]"], r"both set"),
        (["backbone.pooling=pooler", "backbone.layer=0"], r"cannot be combined with backbone.layer/layers"),
        (["backbone.id=scratch:resnet18"], r"unknown scratch backbone; allowed: scratch:resnet18-cifar"),
        (["backbone.id=scratch:resnet18-cifar"], r"is a CNN.*set backbone.pooling: mean"),
        (["backbone.id=timmm:resnet18"], r"unknown backbone source; allowed: .*timm:<name>"),
    ],
)
def test_bad_backbone_keys_fail_before_loading(override, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe(HEAD, override)


def test_options_a_family_does_not_take_are_errors_and_none_means_unset():
    bb = load_backbone("scratch:vit-tiny", pooling="mean", revision=None, layers=None, resolution=None)
    assert bb.options["pooling"] == "mean"
    with pytest.raises(ValueError, match=r"scratch:vit-tiny does not take option\(s\) revision; it takes: pooling, "
                                         r"resolution, layer, layers"):
        load_backbone("scratch:vit-tiny", revision="main")
