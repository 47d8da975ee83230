"""Names listed once (#15): the recipe schema checks `heads[i].act` against `heads.ACTIVATIONS` itself, not a copy,
and reading the schema still imports no torch."""

import subprocess
import sys
import typing

import pytest
from timeouts import HANG_TIMEOUT_S
from torch import nn

from headprobe import heads
from headprobe.recipe import RecipeError, load_recipe
from headprobe.recipe.schema import HeadSpec


def test_the_schemas_activations_are_the_heads_module_s():
    assert typing.get_args(typing.get_type_hints(HeadSpec)["act"]) == tuple(heads.ACTIVATIONS)


def test_an_activation_added_to_the_heads_module_is_accepted_by_the_recipe(monkeypatch):
    with pytest.raises(RecipeError, match=r"heads\[0\]\.act = 'elu' is not allowed; allowed: relu, gelu"):
        load_recipe({"heads": [{"name": "h", "act": "elu"}]})
    monkeypatch.setitem(heads.ACTIVATIONS, "elu", nn.ELU)
    assert load_recipe({"heads": [{"name": "h", "act": "elu"}]}).heads[0].act == "elu"
    head = heads.ProjectionHead(4, depth=2, width=8, act="elu")
    assert any(isinstance(m, nn.ELU) for m in head.modules())


def test_importing_the_recipe_package_imports_no_torch():
    code = "import sys, headprobe.recipe; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    assert done.stdout.strip() == "False", done.stderr[-2000:]
