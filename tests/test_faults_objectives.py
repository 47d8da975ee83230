"""A predictor with an objective that takes none (#40): `predictor: N` with vicreg, info_nce or barlow_twins is
refused by `validate` with one sentence (before, training failed with a bare TypeError); whether an objective takes
a predictor is its own signature's ``(p1, p2, z1, z2)``, a plug-in's too."""

import pytest
import yaml

from headprobe.cli import main
from headprobe.recipe import RecipeError, load_recipe
from headprobe.recipe.objective_inputs import takes_predictor
from headprobe.registry import OBJECTIVES


def _recipe(objective: str, predictor) -> dict:
    return {"heads": [{"name": "mlp", "width": 16, "predictor": predictor}], "objective": {"name": objective}}


@pytest.mark.parametrize("objective", ["vicreg", "info_nce", "barlow_twins"])
def test_a_predictor_with_an_objective_that_takes_none_is_refused_by_validate(objective, tmp_path, capsys):
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(_recipe(objective, 64)))
    assert main(["validate", str(tmp_path / "recipe.yaml")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert " ".join(err.split()) == (
        f"error: heads[0].predictor = 64, but objective {objective} takes no predictor (only an objective of "
        "predictor outputs, such as simsiam, does); remove heads[0].predictor, or use objective: {name: simsiam}.")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe.yaml"]  # validate writes nothing


def test_simsiam_still_needs_one_and_takes_it():
    assert load_recipe(_recipe("simsiam", 8)).heads[0].predictor == 8
    assert load_recipe(_recipe("vicreg", None)).heads[0].predictor is None
    with pytest.raises(RecipeError, match=r"heads\[0\] \(mlp\) has no predictor, which objective simsiam needs"):
        load_recipe(_recipe("simsiam", None))


def byol_like(p1, p2, z1, z2):
    """A plug-in objective of predictor outputs (for the test)."""
    return (p1 - z2).pow(2).mean()


def test_the_objective_s_signature_says_whether_it_takes_a_predictor():
    assert [name for name in OBJECTIVES.names() if takes_predictor(name)] == ["simsiam"]
    OBJECTIVES.add("byol_like", f"{__name__}:byol_like", "a plug-in objective of predictor outputs (a test)")
    try:
        assert takes_predictor("byol_like")
        assert load_recipe(_recipe("byol_like", 8)).objective.name == "byol_like"
        with pytest.raises(RecipeError, match="has no predictor, which objective byol_like needs"):
            load_recipe(_recipe("byol_like", None))
    finally:
        OBJECTIVES.remove("byol_like")
