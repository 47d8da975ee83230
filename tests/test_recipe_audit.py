"""Recipe checks that must fail at `validate` time (exit 2), before any model loads."""

import pytest
import yaml

from headprobe.recipe import RecipeError, expand_sweep, load_recipe

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


@pytest.mark.parametrize("sweep, message", [
    ({"heads.0.actt": ["relu"]}, r"sweep combination actt=relu: unknown key 'heads\[0\]\.actt'.*Did you mean 'act'"),
    ({"heads.0.act": ["relu", "bogus"]}, r"sweep combination act=bogus: heads\[0\]\.act = 'bogus' is not allowed"),
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
