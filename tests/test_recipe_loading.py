"""recipe.loading: YAML, overrides, sweeps and the generic checker (types, declared ranges, registered names)."""

import pytest
import yaml

from headprobe.probes.builtin.knn import KnnSpec
from headprobe.recipe import Recipe, RecipeError, apply_override, dump_recipe, expand_sweep, load_recipe

HEADS = {"heads": [{"name": "relu", "width": 16}], "augment": {"preset": "crop-flip", "views": 2}}


def test_defaults_and_yaml_round_trip(tmp_path):
    recipe = load_recipe({})
    assert recipe == Recipe()
    path = tmp_path / "r.yaml"
    path.write_text(dump_recipe(recipe))
    assert load_recipe(path).to_dict() == {**recipe.to_dict(), "name": "run"}


def test_overrides_are_yaml_typed_and_keep_default_probes():
    recipe = load_recipe({}, ["backbone.pooling=mean", "probes.knn.ks=[1, 3]", "seed=7", "data.limit.train=50"])
    assert recipe.backbone.pooling == "mean"
    assert recipe.probes["knn"] == KnnSpec(ks=[1, 3])
    assert set(recipe.probes) == {"linear", "knn"}
    assert (recipe.seed, recipe.data.limit.train) == (7, 50)


def test_file_name_is_default_recipe_name(tmp_path):
    path = tmp_path / "my_study.yaml"
    path.write_text(yaml.safe_dump({"seed": 1}))
    assert load_recipe(path).name == "my_study"


@pytest.mark.parametrize(
    "override, message",
    [
        ("backbon.id=x", r"unknown key 'backbon'.*Did you mean 'backbone'"),
        ("backbone.poolin=cls", r"unknown key 'backbone.poolin'.*Did you mean 'pooling'"),
        ("backbone.pooling=maen", r"backbone.pooling = 'maen'.*allowed: cls, mean, cls\+mean.*Did you mean 'mean'"),
        ("seed=abc", r"seed = 'abc' has the wrong type; expected an integer"),
        ("seed=true", r"seed = True has the wrong type"),
        ("features.cache=1", r"features.cache = 1 has the wrong type; expected true or false"),
        ("features.precision=fp8", r"features.precision = 'fp8' is not allowed; allowed: fp32, bf16, fp16"),
        ("backbone.id=hff:x", r"unknown backbone source.*Did you mean 'hf:<hub id or local dir>'"),
        ("backbone.id=offline:dinov2-vits16", r"unknown offline backbone.*Did you mean 'offline:dinov2-vits14'"),
        ("data.source=sklearn-digit", r"unknown data source.*Did you mean 'sklearn-digits'"),
        ("probes.lineer={}", r"probes.lineer: unknown probe 'lineer'.*Did you mean 'linear'"),
        ("probes.knn.ks=[0]", r"probes.knn.ks\[0\] = 0 is out of range"),
        ("probes.knn.ks=5", r"probes.knn.ks = 5 has the wrong type; expected a list of int"),
        ("data.val_fraction=1.5", r"data.val_fraction = 1.5 is out of range"),
        ("seed.x=1", r"seed is 0, not a section"),
    ],
)
def test_bad_recipes_name_key_value_and_fix(override, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe({"seed": 0}, [override])


@pytest.mark.parametrize("item", ["noequals", "=3", "a..b=1", "x=[unclosed"])
def test_bad_override_syntax(item):
    with pytest.raises(RecipeError, match="override"):
        apply_override({}, item)


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipe(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\n")
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("3\n")
    with pytest.raises(RecipeError, match="mapping"):
        load_recipe(scalar)


def test_every_shipped_recipe_validates(monkeypatch):
    from pathlib import Path

    recipes = sorted(Path(__file__).parents[1].joinpath("recipes").glob("*.yaml"))
    assert recipes
    for path in recipes:
        backbone = yaml.safe_load(path.read_text())["backbone"]["id"]
        if backbone.startswith("ssl:") and not Path(backbone.split(":", 2)[2]).exists():
            # A checkpoint downloaded by hand (e.g. DINO's): absent here, validate says where to get it, and the
            # rest of the recipe is checked with the file's inspection left out (tests/test_ssl_validate.py
            # validates these recipes against stand-in files in the same layout).
            with pytest.raises(RecipeError, match="no such file.*https://"):
                load_recipe(path)
            with monkeypatch.context() as m:
                m.setattr("headprobe.ssl.inspect_checkpoint", lambda *a, **k: {})
                load_recipe(path)
            continue
        load_recipe(path)


def test_overrides_index_lists():
    recipe = load_recipe({"heads": [{"name": "a"}, {"name": "b"}]}, ["heads.1.act=swish", "heads.0.width=64"])
    assert (recipe.heads[0].width, recipe.heads[1].act) == (64, "swish")
    with pytest.raises(RecipeError, match=r"heads.2 is not an index of a list of 2 items \(use 0 to 1\)"):
        load_recipe({"heads": [{"name": "a"}, {"name": "b"}]}, ["heads.2.act=swish"])


def test_tuning_needs_a_head():
    with pytest.raises(RecipeError, match="backbone.tune = 'lora' trains the backbone through projection heads"):
        load_recipe({"backbone": {"tune": "lora"}})
    assert load_recipe({"backbone": {"tune": "last:2"}, "heads": [{"name": "h"}]}).backbone.tune == "last:2"


@pytest.mark.parametrize("sweep, message", [
    ({"heads.0.actt": ["relu"]}, r"sweep combination actt=relu: unknown key 'heads\[0\]\.actt'.*Did you mean 'act'"),
    ({"heads.0.act": ["relu", "bogus"]},
     r"sweep combination act=bogus: heads\[0\]\.act = 'bogus': unknown activation 'bogus'"),
    ({"heads.0.act": []}, r"sweep\.heads\.0\.act must be a non-empty list"),
    ({"heads.3.act": ["relu"]}, r"sweep combination act=relu: override 'heads\.3\.act=relu'"),
])
def test_every_sweep_combination_is_validated_by_load_recipe(sweep, message, tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**HEADS, "sweep": sweep}))
    with pytest.raises(RecipeError, match=message):
        load_recipe(path)
    with pytest.raises(RecipeError, match=message):  # run (expand_sweep) rejects it the same way
        expand_sweep(path)


def test_a_valid_sweep_still_expands():
    recipe = {**HEADS, "sweep": {"heads.0.act": ["relu", "swish"]}}
    assert load_recipe(recipe).sweep == {"heads.0.act": ["relu", "swish"]}
    assert [label for label, _ in expand_sweep(recipe)] == ["act=relu", "act=swish"]


def test_duplicate_keys_are_refused_with_key_and_line(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("name: x\nbackbone:\n  pooling: cls\n  pooling: mean\n")
    with pytest.raises(RecipeError, match=r"duplicate key 'pooling' at line 4 \(first given at line 3\)"):
        load_recipe(path)
    path.write_text("seed: 1\nprobes: {knn: {}}\nseed: 2\n")
    with pytest.raises(RecipeError, match=r"duplicate key 'seed' at line 3 \(first given at line 1\)"):
        load_recipe(path)
    with pytest.raises(RecipeError, match=r"override 'probes=\{knn: \{\}, knn: null\}': duplicate key 'knn'"):
        load_recipe({}, ["probes={knn: {}, knn: null}"])
    path.write_text("base: &b {k: 1}\nseed: 1\n")  # anchors and merges stay legal YAML
    with pytest.raises(RecipeError, match="unknown key 'base'"):
        load_recipe(path)


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "---\n"])
def test_an_empty_recipe_file_is_refused(text, tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError, match=r"empty\.yaml' is empty; a recipe is a mapping"):
        load_recipe(path)


def test_python_values_override_after_strings():
    recipe = load_recipe({}, ["seed=3", "name=yes"], {"train.epochs": 2, "name": "on", "probes.knn.ks": [3]})
    assert (recipe.seed, recipe.train.epochs, recipe.name, recipe.probes["knn"].ks) == (3, 2, "on", [3])
    with pytest.raises(RecipeError, match=r"train\.epochs = 0 is out of range"):
        load_recipe({}, values={"train.epochs": 0})
    with pytest.raises(RecipeError, match=r"seed = '1' has the wrong type"):  # no YAML parsing of values
        load_recipe({}, values={"seed": "1"})


def test_a_yaml_exponent_read_as_text_gets_the_spelling_yaml_reads_as_a_number():
    with pytest.raises(RecipeError, match=r"train.lr = '1e-3'.*write 1\.0e-3\.$"):
        load_recipe({"train": {"lr": "1e-3"}})
    with pytest.raises(RecipeError, match=r"train.epochs = '1e3'.*write 1000\.$"):
        load_recipe({"train": {"epochs": "1e3"}})
    assert yaml.safe_load("1.0e-3") == 0.001 and yaml.safe_load("1e-3") == "1e-3"  # why the hint is right
    with pytest.raises(RecipeError, match=r"expected a number\.$"):
        load_recipe({"train": {"lr": "fast"}})


@pytest.mark.parametrize(("text", "message"), [
    ("a: " + "{a: " * 100_000 + "1" + "}" * 100_000 + "\n", r"nests deeper than 64 levels \(at line 1\)"),
    ("probes: " + "[" * 100_000 + "]" * 100_000 + "\n", "nests deeper than 64 levels"),
    ("on: 1\n", r"the key `on` at line 1 is read by YAML as a boolean; quote it \('on':\)"),
    ("probes:\n  linear: {}\n  no: {}\n", "the key `no` at line 3 is read by YAML as a boolean"),
])
def test_recipes_too_deep_or_with_boolean_keys_are_refused_with_a_sentence(tmp_path, text, message):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError, match=message):
        load_recipe(path)


def test_a_path_that_is_not_a_regular_file_is_named_so(tmp_path):
    import os

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for path in ("/dev/zero", "/dev/urandom", str(fifo), str(tmp_path)):
        with pytest.raises(RecipeError, match="is not a regular file"):
            load_recipe(path)
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipe(tmp_path / "missing.yaml")
