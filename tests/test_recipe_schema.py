"""recipe.schema: the probes' options are their declarations' (defaults equal to the estimators' own where a probe
passes them on), and names and ranges are declared once."""

import dataclasses
import inspect

import pytest

from headprobe.probes.declaration import declared_probe
from headprobe.probes.knn import knn
from headprobe.probes.linear import linear_probe
from headprobe.recipe import HeadSpec, Range, RecipeError, load_recipe
from headprobe.recipe.fields import check_range
from headprobe.registry import AUGMENT_PRESETS, HEADS, OBJECTIVES, ORBIT_SWEEPS, PROBES

# The linear and k-NN probes pass their options on to these estimators, whose own defaults direct callers get.
FORWARDED_TO = {"linear": linear_probe, "knn": knn}


@pytest.mark.parametrize("name", PROBES.names())
def test_every_probe_option_is_taken_by_the_probe_and_forwarded_defaults_equal_the_estimators(name):
    probe = declared_probe(name)
    assert PROBES.entry(name).target == f"headprobe.probes.builtin.{name}:{name.upper()}"
    params = dict(inspect.signature(probe.function).parameters)
    forwarded = dict(inspect.signature(FORWARDED_TO[name]).parameters) if name in FORWARDED_TO else {}
    for f in dataclasses.fields(probe.options):
        assert f.name in params or f.name in forwarded, f"probes.{name}.{f.name} is not an option of the {name} probe"
        if f.name in forwarded:
            default = forwarded[f.name].default
            ours = getattr(probe.options(), f.name)
            assert (list(default) if isinstance(default, tuple) else default) == ours, (name, f.name)


def test_a_probe_function_gets_its_declared_defaults_for_the_options_not_given():
    probe = declared_probe("rotation")
    seen = {}
    spy = dataclasses.replace(probe, function=lambda tap, **options: seen.update(options))
    spy("tap", mlp_epochs=3)
    assert seen == {"C_grid": None, "mlp_hidden": 256, "mlp_epochs": 3, "standardized_probe": True}


def test_knn_chunk_size_is_the_probes_and_changes_no_prediction():
    assert load_recipe({}).probes["knn"].chunk_size == 256 == inspect.signature(knn).parameters["chunk_size"].default


@pytest.mark.parametrize("override, registry", [
    ("heads.0.type=mlpp", HEADS), ("augment.preset=simclrr", AUGMENT_PRESETS), ("objective.name=vicregg", OBJECTIVES),
    ("probes.orbits.sweeps=[hue, blurr]", ORBIT_SWEEPS),
])
def test_names_are_checked_against_the_registry(override, registry):
    names = registry.names()
    with pytest.raises(RecipeError, match=rf"unknown {registry.family} .*allowed: {', '.join(names)}\. Did you mean"):
        load_recipe({"heads": [{"name": "h"}]}, [override])


def test_a_name_registered_later_is_accepted():
    HEADS.add("test-only", "headprobe.train.heads:projection_head", "a head type registered by this test")
    try:
        assert load_recipe({"heads": [{"name": "h", "type": "test-only"}]}).heads[0].type == "test-only"
    finally:
        HEADS.remove("test-only")


@pytest.mark.parametrize("bounds, inside, outside, words", [
    (Range(1), [1, 10**9], [0, -1], "it must be >= 1"),
    (Range(0, open_low=True), [1e-300], [0.0, -1.0], "it must be > 0"),
    (Range(0, 1, open_low=True, open_high=True), [0.5], [0, 1], "it must be in (0, 1)"),
    (Range(0, 1, open_high=True), [0, 0.99], [1, -0.1], "it must be in [0, 1)"),
    (Range(1, 100), [1, 100], [0, 101], "it must be in [1, 100]"),
])
def test_ranges_accept_and_refuse_at_their_bounds(bounds, inside, outside, words):
    for value in inside:
        check_range("x", value, bounds)
    for value in outside:
        with pytest.raises(RecipeError) as err:
            check_range("x", value, bounds)
        assert str(err.value) == f"x = {value!r} is out of range; {words}."


def test_ranges_are_declared_on_the_fields():
    depth = {f.name: f for f in dataclasses.fields(HeadSpec)}["depth"]
    assert depth.metadata["range"] == Range(1)
    with pytest.raises(RecipeError, match=r"heads\[0\]\.depth = 0 is out of range; it must be >= 1"):
        load_recipe({"heads": [{"name": "h", "depth": 0}]})
