"""Names listed once (#15, #29): `heads[i].act` is checked against the ACTIVATIONS registry, which the heads also
build from, and reading the schema still imports no torch."""

import subprocess
import sys

import pytest
from timeouts import HANG_TIMEOUT_S
from torch import nn

from headprobe.recipe import RecipeError, load_recipe
from headprobe.registry import ACTIVATIONS
from headprobe.train import heads


def test_every_registered_activation_builds_its_module():
    for name in ACTIVATIONS.names():
        head = heads.ProjectionHead(4, depth=2, width=8, act=name)
        assert any(isinstance(m, ACTIVATIONS.get(name)) for m in head.modules()), name


def test_an_activation_registered_later_is_accepted_by_the_recipe_and_built():
    with pytest.raises(RecipeError, match=r"heads\[0\]\.act = 'elu': unknown activation 'elu'; allowed: relu, gelu"):
        load_recipe({"heads": [{"name": "h", "act": "elu"}]})
    ACTIVATIONS.add("elu", "torch.nn:ELU", "exponential linear unit")
    try:
        assert load_recipe({"heads": [{"name": "h", "act": "elu"}]}).heads[0].act == "elu"
        head = heads.ProjectionHead(4, depth=2, width=8, act="elu")
        assert any(isinstance(m, nn.ELU) for m in head.modules())
    finally:
        ACTIVATIONS.remove("elu")


def test_importing_the_recipe_package_imports_no_torch():
    code = "import sys, headprobe.recipe; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    assert done.stdout.strip() == "False", done.stderr[-2000:]
