"""`headprobe validate` on every GPU-sized `paper_*` recipe and on every recipe docs/claims.md names for claims 1–4:
each must pass the command-line check a user runs first (the recipe, the environment, the data source), without
loading a model or a data set, so a GPU recipe that cannot be run here is still known to start."""

import re
from pathlib import Path

import pytest

from headprobe.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAPER = sorted((ROOT / "recipes").glob("paper_*.yaml"))


def claims_1_to_4_recipes() -> list[str]:
    """The recipe names in the first four rows of docs/claims.md's table (claims 1–4)."""
    rows = [line for line in (ROOT / "docs" / "claims.md").read_text().splitlines() if re.match(r"\| [1-4]\. ", line)]
    assert len(rows) == 4, "docs/claims.md's table has a row per claim, 1. to 4."
    names = {name for row in rows for name in re.findall(r"`((?:offline|paper|scratch)_[a-z_]+)`", row)}
    return sorted(names)


def test_every_paper_recipe_is_listed():
    assert {p.stem for p in PAPER} >= {"paper_collapse", "paper_metric", "paper_saddle_grid"}


@pytest.mark.parametrize("name", sorted({p.stem for p in PAPER} | set(claims_1_to_4_recipes())))
def test_the_recipe_validates_on_the_command_line(name, capsys):
    path = ROOT / "recipes" / f"{name}.yaml"
    assert path.exists(), f"docs/claims.md names {name}, which is not in recipes/"
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith("ok ")
