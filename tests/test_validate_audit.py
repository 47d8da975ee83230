"""`validate` refuses what `run` would refuse (issue #18): every numeric field of the schema rejects NaN and
infinities, and each value that used to pass validation and then fail (or never end) at run time exits 2."""

import dataclasses
import math
import typing
from pathlib import Path

import pytest

from headprobe.cli import main
from headprobe.probes.declaration import declared_probes
from headprobe.recipe import Recipe, RecipeError, load_recipe

# Every built-in probe's options class, as its declaration gives it.
PROBE_OPTIONS = {probe.name: probe.options for probe in declared_probes() if probe.options is not None}

QUICKSTART = str(Path(__file__).resolve().parents[1] / "recipes" / "quickstart.yaml")
HEADS = {"heads": [{"name": "relu", "width": 16}], "augment": {"preset": "crop-flip", "views": 2}}


def _numeric(tp) -> str | None:
    """'number', 'list' (of numbers) or None for a schema type."""
    args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    for arg in args:
        if arg in (int, float):
            return "number"
        if typing.get_origin(arg) is list and typing.get_args(arg)[0] in (int, float):
            return "list"
    return None


def _numeric_fields(cls, prefix: str):
    """(dotted key, 'number' | 'list') of every numeric field of `cls`, recursing into nested dataclasses."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, key = hints[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            yield from _numeric_fields(tp, key + ".")
        elif typing.get_origin(tp) is list and dataclasses.is_dataclass(typing.get_args(tp)[0]):
            yield from _numeric_fields(typing.get_args(tp)[0], key + ".0.")
        elif f.metadata.get("named"):
            for name, spec in PROBE_OPTIONS.items():
                yield from _numeric_fields(spec, f"{key}.{name}.")
        elif kind := _numeric(tp):
            yield key, kind


FIELDS = sorted(_numeric_fields(Recipe, ""))


def test_the_schema_walk_sees_every_probe_and_nested_section():
    keys = {k for k, _ in FIELDS}
    assert {"seed", "train.lr", "heads.0.out_dim", "data.limit.train", "backbone.lora.alpha",
            "probes.knn.temperature", "probes.linear.C_grid", "geometry.rows"} <= keys
    assert {k.split(".")[1] for k in keys if k.startswith("probes.")} == set(PROBE_OPTIONS)


@pytest.mark.parametrize("key, kind", FIELDS, ids=[k for k, _ in FIELDS])
@pytest.mark.parametrize("bad", [".nan", ".inf", "-.inf"])
def test_every_numeric_field_rejects_nan_and_infinities(key, kind, bad):
    value = f"[{bad}]" if kind == "list" else bad
    with pytest.raises(RecipeError, match=rf"{key.replace('.0.', '[0].').split('.')[-1]}.* = .*"
                                          r"(not a finite number|wrong type)"):
        load_recipe(HEADS, [f"{key}={value}"])


@pytest.mark.parametrize("override, words", [
    ("train.lr=.nan", "train.lr = nan is not a finite number"),
    ("train.lr=.inf", "train.lr = inf is not a finite number"),
    ("heads.0.out_dim=-5", "heads[0].out_dim = -5 is out of range; it must be in [1, 1048576]"),
    ("data.test_fraction=.nan", "data.test_fraction = nan is not a finite number"),
    ("data.val_fraction=.nan", "data.val_fraction = nan is not a finite number"),
    ("data.val_fraction=0", "data.val_fraction = 0.0 is out of range; it must be in (0, 1)"),
    ("probes.knn.temperature=.nan", "probes.knn.temperature = nan is not a finite number"),
    (f"seed={2**70}", f"seed = {2**70} is out of range; it must be in [0, 4294967295]"),
    ("probes.orbits.n_images=0", "probes.orbits.n_images = 0 is out of range; it must be >= 1"),
    ("probes.orbits.n_images=-3", "probes.orbits.n_images = -3 is out of range"),
    ("probes.view_mi.batch_size=0", "probes.view_mi.batch_size = 0 is out of range; it must be >= 2"),
    ("probes.augment_r2.folds=0", "probes.augment_r2.folds = 0 is out of range; it must be >= 2"),
    ("probes.spectrum.top_k=-1", "probes.spectrum.top_k = -1 is out of range; it must be >= 1"),
    ("probes.rotation.mlp_epochs=0", "probes.rotation.mlp_epochs = 0 is out of range; it must be >= 1"),
    ("heads.0.predictor=0", "heads[0].predictor = 0 is out of range; it must be in [1, 1048576]"),
    ("probes.linear.tol=-1", "probes.linear.tol = -1.0 is out of range; it must be > 0"),
    ("probes.knn.ks=[5,5]", "lists a k twice"),
    ("backbone.layer=999", "backbone.layer names block 999, but offline:dinov2-vits14 has 12 blocks; use -12..11"),
    ("backbone.resolution=1", "backbone.resolution = 1 is below the patch size 14 of offline:dinov2-vits14"),
    (f"train.epochs={10**24}", f"train.epochs = {10**24} is out of range; it must be in [1, 100000]"),
    (f"train.steps={10**12}", "train.steps = 1000000000000 is out of range; it must be in [1, 10000000]"),
    ("train.momentum=-1", "train.momentum = -1.0 is out of range; it must be in [0, 1)"),
    ("objective.options.temperature=.nan", "objective.options.temperature = nan is not a finite number"),
])
def test_validate_exits_2_on_values_run_would_refuse(override, words, capsys):
    assert main(["validate", QUICKSTART, "--set", "heads=[{name: a}]", "--set", override]) == 2
    assert words in capsys.readouterr().err.replace("\n", "")


def test_knn_ks_larger_than_the_training_set():
    with pytest.raises(RecipeError, match=r"probes\.knn\.ks\[2\] = 100 is more neighbours than the 50 training "
                                          r"images \(data\.limit\.train\)"):
        load_recipe({}, ["data.limit.train=50"])
    # sklearn-digits without a limit: 1797 images less the stratified test quarter (rounded up) = 1347
    assert math.ceil(0.25 * 1797) == 450
    with pytest.raises(RecipeError, match="ks\\[0\\] = 1348 is more neighbours than the 1347 training images"):
        load_recipe({}, ["probes.knn.ks=[1348]"])
    assert load_recipe({}, ["probes.knn.ks=[1347]"]).probes["knn"].ks == [1347]


def test_limit_below_the_number_of_classes_says_so():
    with pytest.raises(RecipeError, match=r"data\.limit\.train = 5 is below the number of classes of sklearn-digits "
                                          r"\(10\).*at least 10"):
        load_recipe({"probes": {"knn": {"ks": [1]}}}, ["data.limit.train=5"])


@pytest.mark.parametrize("backbone, override, words", [
    ("scratch:vit-tiny", "backbone.layers=[0, 3]", "backbone.layers names block 3, but scratch:vit-tiny has 3 blocks"),
    ("scratch:vit-tiny", "backbone.resolution=30", "not a multiple of the patch size 4"),
    ("scratch:resnet18-cifar", "backbone.resolution=4", "backbone.resolution = 4 is below 8 pixels"),
    ("open_clip:ViT-B-32", "backbone.resolution=28", "below the patch size 32 of open_clip:ViT-B-32"),
    ("timm:vit_small_patch14_dinov2.lvd142m", "backbone.resolution=10", "below the patch size 14"),
])
def test_layers_and_resolution_are_checked_without_loading(backbone, override, words):
    pooling = "mean" if "resnet" in backbone else "cls"
    with pytest.raises(RecipeError, match=words.replace("[", r"\[").replace("]", r"\]")):
        load_recipe({"backbone": {"id": backbone, "pooling": pooling}}, [override])


def test_non_utf8_recipes_exit_2_with_a_sentence(tmp_path, capsys):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    garbage = tmp_path / "garbage.yaml"
    garbage.write_bytes(bytes(range(256)) * 4)
    for path in (latin, garbage):
        assert main(["validate", str(path)]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and "error:" in err
    assert main(["validate", str(latin)]) == 2
    assert "is not UTF-8 text" in capsys.readouterr().err
