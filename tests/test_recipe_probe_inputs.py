"""recipe/probe_inputs.py: what a recipe's probes need extracted is read from their declarations, never their names."""

import pytest

from headprobe.recipe import RecipeError, load_recipe
from headprobe.recipe.probe_inputs import OrbitRequest, orbit_request, probe_needs
from headprobe.registry import PROBES


@pytest.fixture
def second_orbit_probe():
    """A plug-in probe registered the old way that needs orbits too, with the orbits probe's options."""
    PROBES.add("orbits2", "headprobe.probes.builtin.orbits:measure_orbits", "orbits again (a test's)",
               needs=("orbits",), options="headprobe.probes.builtin.orbits:OrbitSpec")
    yield
    PROBES.remove("orbits2")


def test_the_needs_and_the_orbits_come_from_the_declarations():
    recipe = load_recipe({"probes": {"linear": {}, "rotation": {}, "orbits": {"sweeps": ["hue"], "n_images": 8}}})
    assert probe_needs(recipe) == {"rotated", "orbits"}
    assert orbit_request(recipe) == OrbitRequest(("hue",), 8, ("orbits",))
    assert orbit_request(load_recipe({"probes": ["linear", "knn"]})) is None


def test_probes_that_need_orbits_ask_for_the_same_ones(second_orbit_probe):
    same = load_recipe({"probes": {"orbits": {"n_images": 8}, "orbits2": {"n_images": 8}}})
    assert orbit_request(same) == OrbitRequest(("rotation45", "rotation360"), 8, ("orbits", "orbits2"))
    with pytest.raises(RecipeError, match=r"probes orbits, orbits2 need orbits, which are extracted once, but ask "
                                          r"for different ones .*give them the same sweeps and n_images"):
        load_recipe({"probes": {"orbits": {"n_images": 8}, "orbits2": {"n_images": 16}}})


def test_a_probe_that_needs_orbits_names_them_in_its_options():
    PROBES.add("bare_orbits", "headprobe.probes.builtin.orbits:measure_orbits", "no options (a test's)",
               needs=("orbits",))
    try:
        with pytest.raises(RecipeError, match="probe 'bare_orbits' needs orbits, but its options name no `sweeps`"):
            load_recipe({"probes": ["bare_orbits"]})
    finally:
        PROBES.remove("bare_orbits")
