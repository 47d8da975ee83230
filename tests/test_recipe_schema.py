"""recipe.schema: the probes' options equal the probe functions' own, and names and ranges are declared once."""

import dataclasses
import inspect

import pytest

from headprobe.probes import suite
from headprobe.probes.knn import knn
from headprobe.probes.linear import linear_probe
from headprobe.recipe import PROBE_SPECS, HeadSpec, Range, RecipeError, load_recipe
from headprobe.registry import AUGMENT_PRESETS, HEADS, OBJECTIVES, ORBIT_SWEEPS, PROBES

# suite.linear and suite.knn pass their **options on to these.
FORWARDED_TO = {"linear": linear_probe, "knn": knn}
# Options whose function default means "what the tap holds": the spec's default chooses what the pipeline extracts.
CHOSEN_BY_THE_PIPELINE = {("orbits", "sweeps")}


def _probe_function(name: str):
    return FORWARDED_TO.get(name) or getattr(suite, name)


@pytest.mark.parametrize("name", list(PROBE_SPECS))
def test_every_probe_option_defaults_to_the_probe_functions_default(name):
    assert PROBES.entry(name).target == f"headprobe.probes.suite:{name}"
    # Options the suite's wrapper takes itself (probes.knn.shard_bank) and those it passes on.
    params = dict(inspect.signature(getattr(suite, name)).parameters) | dict(
        inspect.signature(_probe_function(name)).parameters)
    spec = PROBE_SPECS[name]()
    for f in dataclasses.fields(spec):
        assert f.name in params, f"probes.{name}.{f.name} is not an option of the {name} probe"
        default, ours = params[f.name].default, getattr(spec, f.name)
        if (name, f.name) in CHOSEN_BY_THE_PIPELINE:
            assert default is None
            continue
        assert default is not inspect.Parameter.empty, f"the {name} probe has no default for {f.name}"
        assert (list(default) if isinstance(default, tuple) else default) == ours, (name, f.name)


def test_every_exception_still_exists():
    for name, option in CHOSEN_BY_THE_PIPELINE:
        assert option in {f.name for f in dataclasses.fields(PROBE_SPECS[name])}


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
        bounds.check("x", value)
    for value in outside:
        with pytest.raises(RecipeError) as err:
            bounds.check("x", value)
        assert str(err.value) == f"x = {value!r} is out of range; {words}."


def test_ranges_are_declared_on_the_fields():
    depth = {f.name: f for f in dataclasses.fields(HeadSpec)}["depth"]
    assert depth.metadata["range"] == Range(1)
    with pytest.raises(RecipeError, match=r"heads\[0\]\.depth = 0 is out of range; it must be >= 1"):
        load_recipe({"heads": [{"name": "h", "depth": 0}]})
