"""A plug-in fails alone (#40): one whose module cannot be found is skipped at start-up with one warning line; one
whose module fails on import is taken out the first time anything imports it (one warning), never imported again,
and never fails a run that does not name it; a recipe naming either is refused by `validate` with the import
error's first line."""

import warnings
from importlib import metadata

import pytest
import yaml

from headprobe.cli import main
from headprobe.plugins import load_plugins
from headprobe.probes.declaration import declared_metrics
from headprobe.registry import BACKBONES, FAMILIES, PROBES, Registry


def _families() -> dict[str, Registry]:
    return {name: Registry(name) for name in ("backbones", "data", "probes", "heads", "objectives")}


def _validate(tmp_path, recipe, capsys) -> tuple[int, str]:
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    capsys.readouterr()
    code = main(["validate", str(tmp_path / "recipe.yaml")])
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, err
    return code, " ".join(err.split())


def test_a_plug_in_whose_module_is_missing_is_skipped_at_start_up_without_importing_it():
    eps = {"headprobe.probes": [metadata.EntryPoint("ghost", "ghost_missing_mod:probe", "headprobe.probes")],
           "headprobe.objectives": [metadata.EntryPoint("fine", "headprobe.train.objectives:vicreg",
                                                        "headprobe.objectives")]}
    families = _families()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        taken = load_plugins(families, entry_points=lambda group: eps.get(group, []))
    assert taken == ["objectives:fine"]
    assert [str(w.message) for w in caught] == [
        "headprobe plug-in probes 'ghost' (from ghost_missing_mod:probe) cannot be imported (ModuleNotFoundError: No "
        "module named 'ghost_missing_mod'); headprobe runs without it. Fix or uninstall that package."]
    assert "ghost" not in families["probes"] and families["probes"].names() == []
    assert families["probes"].unavailable("ghost") == "ModuleNotFoundError: No module named 'ghost_missing_mod'"


@pytest.fixture
def broken_probe(tmp_path, monkeypatch):
    """A probe plug-in whose module is there but fails on import; `counter` counts the imports tried. (One name
    for every test: the metric declarations are cached by the registered (name, target) pairs, and the slow test
    below then imports the plug-in for the first time or not, by the order the tests run in; it checks only that
    the run finishes.)"""
    site = tmp_path / "site"
    site.mkdir()
    counter = tmp_path / "imports"
    (site / "broken_probe_mod.py").write_text(
        f"with open({str(counter)!r}, 'a') as f:\n    f.write('x')\nimport torchvisionx_not_installed  # noqa\n")
    monkeypatch.syspath_prepend(str(site))
    PROBES.add("broken", "broken_probe_mod:probe", "plug-in from broken-pkg 1.0")
    yield counter
    PROBES.remove("broken")


def test_a_plug_in_failing_on_import_is_taken_out_once_and_never_imported_again(broken_probe):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = declared_metrics()
        assert declared_metrics() == metrics and metrics  # the built-ins' metrics, the broken plug-in left out
    assert [str(w.message) for w in caught] == [
        "headprobe plug-in probe 'broken' (from broken-pkg 1.0) cannot be imported (ModuleNotFoundError: No module "
        "named 'torchvisionx_not_installed'); headprobe runs without it. Fix or uninstall that package."]
    assert broken_probe.read_text() == "x" and "broken" not in PROBES.names()


def test_validate_refuses_a_recipe_naming_a_broken_plug_in_with_the_import_error(broken_probe, tmp_path, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code, err = _validate(tmp_path, {"probes": {"broken": {}}}, capsys)
        assert code == 2
        assert err == ("error: probes.broken: the probe plug-in 'broken' cannot be imported (ModuleNotFoundError: No "
                       "module named 'torchvisionx_not_installed'); fix or uninstall the package that provides it, "
                       "or leave it out of the recipe.")
        code, again = _validate(tmp_path, {"probes": ["broken"]}, capsys)  # taken out now: the same sentence
        assert code == 2 and again == err
    assert broken_probe.read_text() == "x"


def test_validate_refuses_a_backbone_plug_in_that_cannot_be_imported(tmp_path, capsys):
    eps = {"headprobe.backbones": [metadata.EntryPoint("ghostnet", "ghostnet_missing:load", "headprobe.backbones")]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load_plugins(FAMILIES, entry_points=lambda group: eps.get(group, []))
    try:
        code, err = _validate(tmp_path, {"backbone": {"id": "ghostnet:small"}}, capsys)
        assert code == 2
        assert err.startswith("error: backbone.id = 'ghostnet:small': the backbone source plug-in 'ghostnet' cannot "
                              "be imported (ModuleNotFoundError: No module named 'ghostnet_missing')")
    finally:
        BACKBONES.remove("ghostnet")
    assert BACKBONES.unavailable("ghostnet") is None


@pytest.mark.slow
def test_a_broken_plug_in_never_fails_a_run_that_does_not_name_it(broken_probe, tmp_path, capsys):
    import json

    recipe = {"name": "tiny", "backbone": {"id": "scratch:vit-tiny", "pooling": "cls"},
              "data": {"source": "sklearn-digits", "limit": {"train": 80, "test": 40}}, "features": {"batch_size": 40},
              "probes": {"knn": {"ks": [5]}, "linear": {"C_grid": [1.0]}}, "report": True}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["run", str(tmp_path / "recipe.yaml"), "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert len([w for w in caught if "broken" in str(w.message)]) <= 1
    assert json.loads((tmp_path / "run" / "results.json").read_text())["status"] == "complete"
    assert (tmp_path / "run" / "report.html").is_file()
    assert not broken_probe.exists() or broken_probe.read_text() == "x"  # imported once at most
