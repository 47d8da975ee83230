import pytest
import yaml

from headprobe.recipe import KnnSpec, Recipe, RecipeError, apply_override, dump_recipe, load_recipe


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


def test_every_shipped_recipe_validates():
    from pathlib import Path

    recipes = sorted(Path(__file__).parents[1].joinpath("recipes").glob("*.yaml"))
    assert recipes
    for path in recipes:
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
