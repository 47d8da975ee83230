"""The report's Jinja2 templates (headprobe/report/templates/): each compiles, autoescaping is on, and a wheel
built from the project (what `pip install .` installs, not an editable checkout) carries every one of them."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import jinja2
import pytest
from timeouts import HANG_TIMEOUT_S

from headprobe.report.markup import environment, render

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "headprobe" / "report" / "templates"


def test_every_template_compiles_and_autoescapes():
    names = environment().list_templates()
    on_disk = sorted(str(p.relative_to(TEMPLATES)) for p in TEMPLATES.rglob("*") if p.is_file())
    assert sorted(names) == on_disk and "report.html.j2" in names and "compare.html.j2" in names
    for name in names:
        environment().get_template(name)  # a syntax error raises here
    assert str(render("sections/recipe.html.j2", text="a: <b>")) == (
        "<p class='legend'>The resolved recipe (defaults and --set overrides applied).</p><pre>a: &lt;b&gt;</pre>")
    with pytest.raises(jinja2.UndefinedError):  # a name the caller forgot is an error, not a blank cell
        render("sections/recipe.html.j2")


@pytest.mark.slow
def test_a_wheel_of_the_project_ships_every_template(tmp_path):
    """Built offline from a copy (no build/ or egg-info left in the checkout), with the environment's setuptools."""
    pytest.importorskip("setuptools")
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "headprobe", source / "headprobe", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "wheel"), str(source)], check=True, capture_output=True, timeout=HANG_TIMEOUT_S)
    (wheel,) = (tmp_path / "wheel").glob("headprobe-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {n for n in archive.namelist() if "/templates/" in n}
        metadata = archive.read(next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    expected = {f"headprobe/report/templates/{p.relative_to(TEMPLATES)}" for p in TEMPLATES.rglob("*") if p.is_file()}
    assert shipped == expected
    assert "Requires-Dist: jinja2" in metadata
