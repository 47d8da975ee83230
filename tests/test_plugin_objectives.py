"""A plug-in objective declares whether it takes the heads' predictor outputs by its signature: ``(p1, p2, z1, z2)``
takes them (as simsiam does), ``(z1, z2)`` does not (`recipe.objective_inputs.takes_predictor`). Installed as a
package would be (a dist-info with `headprobe.objectives` entry points), `headprobe validate` accepts a predictor
objective with `predictor:` set, and refuses it without one, and refuses a predictor with an objective that takes
none: exit 2, one sentence naming the fix, no traceback."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

MODULE = '''
"""Two objectives of a plug-in package (a test): one of predictor outputs, one without."""


def byol_like(p1, p2, z1, z2, scale: float = 1.0):
    return scale * ((p1 - z2.detach()).pow(2).mean() + (p2 - z1.detach()).pow(2).mean())


def plain_mse(z1, z2):
    return (z1 - z2).pow(2).mean()
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The plug-in package installed into a folder as pip would: its module and a dist-info naming its entries."""
    site = tmp_path_factory.mktemp("site")
    (site / "objective_plugin_mod.py").write_text(MODULE)
    info = site / "objective_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: objective-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[headprobe.objectives]\nbyol_like = objective_plugin_mod:byol_like\n"
                                           "plain_mse = objective_plugin_mod:plain_mse\n")
    return site


def _validate(site: Path, tmp_path: Path, objective: str, predictor) -> tuple[int, str]:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"heads": [{"name": "mlp", "width": 16, "predictor": predictor}],
                                      "objective": {"name": objective}}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "headprobe", "validate", str(recipe)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, " ".join(done.stderr.split())


def test_a_plug_in_objective_of_predictor_outputs_is_accepted_with_a_predictor(site, tmp_path):
    code, err = _validate(site, tmp_path, "byol_like", 8)
    assert (code, err) == (0, "")


def test_a_plug_in_objective_of_predictor_outputs_is_refused_without_one(site, tmp_path):
    code, err = _validate(site, tmp_path, "byol_like", None)
    assert code == 2
    assert err == ("error: heads[0] (mlp) has no predictor, which objective byol_like needs; set "
                   "heads[0].predictor to a width, e.g. 512.")


def test_a_plug_in_objective_that_takes_no_predictor_is_refused_with_one(site, tmp_path):
    code, err = _validate(site, tmp_path, "plain_mse", 64)
    assert code == 2
    assert err.startswith("error: heads[0].predictor = 64, but objective plain_mse takes no predictor")
    assert err.endswith("remove heads[0].predictor, or use objective: {name: simsiam}.")
    assert _validate(site, tmp_path, "plain_mse", None)[0] == 0
