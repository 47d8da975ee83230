"""An augmentation preset and an orbit sweep registered from outside the package run end to end (#29): the recipe
accepts their names and the run loads their definitions through the AUGMENT_PRESETS and ORBIT_SWEEPS registries."""

import pytest

from headprobe import run
from headprobe.data.augment import AugmentSpec
from headprobe.data.orbits import OrbitSweep, sweep_values
from headprobe.registry import AUGMENT_PRESETS, ORBIT_SWEEPS

# Flips only, always: every view of an image is its mirror image or itself.
MIRROR = AugmentSpec(flip_p=1.0)
# Blur from sharp to sigma 2 px in 3 steps (digits are grey, so a colour sweep would not move them).
SOFTEN = OrbitSweep("blur", 0.0, 2.0, 3, identity=0.0)


@pytest.fixture
def registered():
    AUGMENT_PRESETS.add("mirror", f"{__name__}:MIRROR", "always flipped (a test plug-in)")
    ORBIT_SWEEPS.add("soften", f"{__name__}:SOFTEN", "blur sigma 0-2 px in 3 steps (a test plug-in)")
    yield
    AUGMENT_PRESETS.remove("mirror")
    ORBIT_SWEEPS.remove("soften")


def test_the_definitions_come_from_the_registry(registered):
    from headprobe.data.augment import augment_spec

    assert augment_spec("mirror", size=16) == AugmentSpec(flip_p=1.0, size=16)
    assert sweep_values("soften") == [0.0, 1.0, 2.0]


@pytest.mark.slow
def test_a_registered_preset_and_sweep_run_through_a_recipe(tiny_recipe, tmp_path, registered):
    recipe = {**tiny_recipe, "heads": [{"name": "mlp", "width": 8}], "train": {"epochs": 1, "batch_size": 50},
              "augment": {"preset": "mirror", "views": 2},
              "probes": {**tiny_recipe["probes"], "augment_r2": {}, "orbits": {"sweeps": ["soften"], "n_images": 6}}}
    results = run(recipe, out=tmp_path / "r", quiet=True)
    assert results["recipe"]["augment"]["preset"] == "mirror"
    # Every view is flipped with p = 1: the flip parameter never varies, so augment_r2 has nothing to regress there.
    assert "flip" in results["taps"]["mlp"]["protocol"]["augment_r2"]["skipped"]
    assert results["taps"]["backbone"]["protocol"]["orbits"]["sweeps"]["soften"]["values"] == [0.0, 1.0, 2.0]
    # Blur moves the backbone's features: the orbit has a spread, at the backbone and at the head.
    for tap in ("backbone", "mlp"):
        assert results["taps"][tap]["metrics"]["soften.orbit.spread_rel"] > 0, tap
