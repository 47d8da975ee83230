"""Nothing outside a run's folder is touched (#40): sweep labels and head names that would name a path (``..``,
``.``, empty, absolute, with separators) are refused by `validate` with one sentence, and every path a sweep derives
resolves inside the sweep's folder."""

import os

import pytest
import yaml

from headprobe.cli import main
from headprobe.recipe import RecipeError, expand_sweep, sweep_folder_name
from headprobe.recipe.folder_names import folder_name_problem, is_inside

SWEEP = {"name": "tiny", "heads": [{"name": "h", "type": "mlp"}], "sweep": {"heads.0.act": ["relu", "swish"]}}
HOSTILE = ["..", ".", "", "  ", "/tmp/elsewhere", "../x", "a/b", "a\\b"]


def _files(root) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), root) for d, _, names in os.walk(root) for f in names}


def _validate(tmp_path, recipe, capsys) -> tuple[int, str]:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    capsys.readouterr()
    code = main(["validate", str(path)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.mark.parametrize("label", HOSTILE)
def test_a_sweep_label_naming_a_path_is_refused_by_validate(label, tmp_path, capsys):
    before = _files(tmp_path)
    code, err = _validate(tmp_path, {**SWEEP, "sweep_labels": [label, "ok"]}, capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")
    assert "sweep_labels" in err and "each label names one run's folder" in " ".join(err.split())
    assert _files(tmp_path) == before | {"recipe.yaml"}


@pytest.mark.parametrize("name", ["..", ".", "/abs", "a/b", "../../escape", ".hidden", "a\\b"])
def test_a_head_name_naming_a_path_is_refused_by_validate(name, tmp_path, capsys):
    code, err = _validate(tmp_path, {"name": "tiny", "heads": [{"name": name, "type": "mlp"}]}, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"heads[0].name = {name!r}" in err and "inside the run folder" in " ".join(err.split())


def test_folder_name_problem_and_is_inside_agree_with_the_file_system(tmp_path):
    for name in HOSTILE + [".", "\0x"]:
        assert folder_name_problem(name) is not None, name
    for name in ["relu", "act=relu", "a b", "x..y", "é"]:
        assert folder_name_problem(name) is None and is_inside(tmp_path, tmp_path / name)
    assert not is_inside(tmp_path, tmp_path / "..") and not is_inside(tmp_path, tmp_path / ".")
    assert not is_inside(tmp_path, tmp_path / "a" / ".." / "..")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    (tmp_path / "link").symlink_to(outside, target_is_directory=True)  # a label folder that is a link elsewhere
    assert not is_inside(tmp_path, tmp_path / "link")


def test_sweep_folder_name_refuses_what_names_no_folder_inside():
    for label in ("", ".", ".."):
        with pytest.raises(RecipeError, match="names|is empty"):
            sweep_folder_name(label)
    assert sweep_folder_name("a/b\\c") == "a_b_c"


@pytest.mark.parametrize("sweep", [
    {"sweep": {"heads.0.act": ["relu", "swish"]}},
    {"sweep": {"data.source": ["imagefolder:..", "imagefolder:/abs", "imagefolder:a/../../b"]}},
    {"sweep": {"backbone": [{"id": "scratch:vit-tiny"}, {"id": "scratch:vit-tiny", "pooling": "mean"}]}},
    {"sweep": {"heads.0.act": ["relu", "swish"]}, "sweep_labels": ["a b", "x..y"]},
    {"sweep_zip": {"seed": [0, 1], "backbone.id": ["hf:../up", "hf:/"]}},
])
def test_every_derived_sweep_folder_resolves_inside_the_sweep(sweep, tmp_path):
    from headprobe.recipe import load_recipe
    from headprobe.record.writer import unit_key

    data = {"name": "tiny", "heads": [{"name": "h", "type": "mlp"}], **sweep}
    root = tmp_path / "sweep"
    combos = expand_sweep(data)
    assert len(combos) >= 2
    for label, items in combos:
        assert is_inside(root, root / label) and (root / label).resolve().parent == root.resolve(), label
        recipe = load_recipe(data, items)
        for head in recipe.heads:  # the per-unit stores of the head's taps, of each seed
            for seed in (None, recipe.seed, *(recipe.seeds or [])):
                store = root / label / "per_unit" / f"{unit_key(head.name, seed)}.safetensors"
                assert store.resolve().parent == (root / label / "per_unit").resolve()


@pytest.mark.slow
def test_a_labelled_sweep_writes_nothing_outside_its_folder(tmp_path, capsys):
    recipe = {"name": "tiny", "backbone": {"id": "scratch:vit-tiny", "pooling": "cls"},
              "data": {"source": "sklearn-digits", "limit": {"train": 80, "test": 40}}, "features": {"batch_size": 40},
              "probes": {"knn": {"ks": [5]}}, "report": False,
              "sweep": {"features.batch_size": [40, 20]}, "sweep_labels": ["first", "x..y"]}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    before = _files(tmp_path)
    assert main(["run", str(path), "--out", str(tmp_path / "sweep")]) == 0
    assert "Traceback" not in capsys.readouterr().err
    written = _files(tmp_path) - before - {f for f in _files(tmp_path) if f.startswith("cache" + os.sep)}
    assert written and all(f.startswith("sweep" + os.sep) for f in written), sorted(written)
    assert {p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir()} == {"first", "x..y"}


def test_two_sweep_runs_never_share_a_folder(tmp_path, capsys):
    code, err = _validate(tmp_path, {"sweep": {"data.source": ["imagefolder:a/b", "imagefolder:a_b"]}}, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "two runs of the sweep would share the folder 'source=imagefolder:a_b'" in err and "sweep_labels" in err
    blocks = [{"id": "scratch:vit-tiny"}, {"id": "scratch:vit-tiny", "pooling": "mean"}]
    assert [label for label, _ in expand_sweep({"sweep": {"backbone": blocks}})] == ["backbone=0",
                                                                                     "backbone.pooling=mean"]


def test_a_sweep_run_folder_linked_outside_the_sweep_is_refused_before_anything_runs(tmp_path, capsys):
    outside, root = tmp_path / "outside", tmp_path / "sweep"
    outside.mkdir()
    (outside / "results.json").write_text("{}")  # looks like a run, so the sweep folder reads as headprobe's own
    root.mkdir()
    (root / "compare.csv").write_text("")
    (root / "first").symlink_to(outside, target_is_directory=True)
    recipe = {"name": "t", "backbone": {"id": "scratch:vit-tiny"}, "probes": {"knn": {"ks": [3]}}, "report": False,
              "sweep": {"features.batch_size": [20, 10]}, "sweep_labels": ["first", "second"]}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    before = _files(tmp_path)
    assert main(["run", str(tmp_path / "recipe.yaml"), "--out", str(root)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"the sweep run 'first' would be written outside {str(root)!r} (its folder resolves to " \
           f"{str(outside)!r}); rename it with sweep_labels." in " ".join(err.split())
    assert _files(tmp_path) == before
