import json
import subprocess
import sys

import pytest
import yaml

from headprobe.cli import main


def _write(tmp_path, recipe):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_run_report_compare_end_to_end(tiny_recipe, tmp_path, capsys):
    path = _write(tmp_path, {**tiny_recipe, "report": True})
    assert main(["run", str(path), "--out", str(tmp_path / "a"), "--set", "probes.knn.ks=[3]"]) == 0
    assert (tmp_path / "a" / "report.html").exists() and any((tmp_path / "a" / "plots").glob("*.png"))
    assert main(["run", str(path), "--out", str(tmp_path / "b"), "--set", "backbone.pooling=mean"]) == 0
    out = capsys.readouterr().out
    assert "linear.acc" in out and "knn.k3.acc" in out
    config = yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())
    assert config["probes"]["knn"]["ks"] == [3] and config["name"] == "tiny"
    assert main(["report", str(tmp_path / "a")]) == 0
    assert "knn.k3.acc" in capsys.readouterr().out
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    table = capsys.readouterr().out
    assert "a" in table and "b" in table and "knn.k20.acc" in table


def test_bad_recipe_exits_2_and_writes_nothing(tiny_recipe, tmp_path, capsys):
    path = _write(tmp_path, tiny_recipe)
    out = tmp_path / "never"
    assert main(["run", str(path), "--out", str(out), "--set", "backbone.pooling=maen"]) == 2
    err = capsys.readouterr().err
    assert "backbone.pooling" in err and "'maen'" in err and "Did you mean 'mean'" in err
    assert not out.exists()
    assert main(["run", str(path), "--out", str(out), "--set", "oops"]) == 2
    assert main(["validate", str(path), "--set", "probes.knnn={}"]) == 2
    assert "Did you mean 'knn'" in capsys.readouterr().err
    assert main(["validate", str(path)]) == 0
    assert main(["report", str(tmp_path / "nothing-here")]) == 2
    assert main(["list", "probez"]) == 2


def test_failure_while_running_exits_1_and_keeps_the_run_dir(tiny_recipe, tmp_path, capsys):
    recipe = {**tiny_recipe, "data": {**tiny_recipe["data"], "label_column": "target"}}
    path = _write(tmp_path, recipe)
    assert main(["run", str(path), "--out", str(tmp_path / "r")]) == 1
    assert "while loading data" in capsys.readouterr().err
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    assert results["status"] == "failed" and results["backbone"]["dim"] == 32


def test_list_names_every_family(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("hf:<hub id or local dir>", "offline:dinov2-vits14", "cls+mean", "sklearn-digits", "knn", "linear"):
        assert name in out


def test_module_entry_point():
    done = subprocess.run([sys.executable, "-m", "headprobe", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and "headprobe 0.1.0" in done.stdout


def test_sweep_expands_into_runs_and_a_comparison(tiny_recipe, tmp_path, capsys):
    from headprobe.recipe import RecipeError, expand_sweep

    recipe = {**tiny_recipe, "probes": {"knn": {"ks": [5]}}, "sweep": {"backbone.pooling": ["cls", "mean"]}}
    assert [label for label, _ in expand_sweep(recipe)] == ["pooling=cls", "pooling=mean"]
    with pytest.raises(RecipeError, match="sweep combination pooling=maen: backbone.pooling = 'maen'"):
        expand_sweep({**recipe, "sweep": {"backbone.pooling": ["cls", "maen"]}})
    path = _write(tmp_path, recipe)
    assert main(["run", str(path), "--out", str(tmp_path / "sw")]) == 0
    assert {p.name for p in (tmp_path / "sw").iterdir()} >= {"pooling=cls", "pooling=mean", "compare.csv",
                                                             "compare.html"}
    cls = json.loads((tmp_path / "sw" / "pooling=cls" / "results.json").read_text())
    assert cls["recipe"]["backbone"]["pooling"] == "cls" and cls["recipe"]["sweep"] == {}
    assert "knn.k5.acc" in (tmp_path / "sw" / "compare.csv").read_text()


def test_geometry_of_a_finished_run_without_retraining(tiny_recipe, tmp_path, capsys):
    recipe = {**tiny_recipe, "probes": {"knn": {"ks": [5]}}, "heads": [{"name": "relu", "width": 16}],
              "augment": {"preset": "crop-flip", "views": 2}, "train": {"epochs": 1, "batch_size": 50}}
    path = _write(tmp_path, recipe)
    assert main(["run", str(path), "--out", str(tmp_path / "r")]) == 0
    before = json.loads((tmp_path / "r" / "results.json").read_text())
    assert before["heads"]["relu"]["geometry"] == {}
    assert main(["geometry", str(tmp_path / "r"), "--rows", "16"]) == 0
    assert "relu: λ_min" in capsys.readouterr().out
    after = json.loads((tmp_path / "r" / "results.json").read_text())
    assert after["heads"]["relu"]["geometry"]["effective_hessian"]["consistency"] < 1e-8
    assert after["geometry_from"] == "checkpoints/step-4.pt"
    assert after["taps"] == before["taps"]
    assert after["timing"] == before["timing"]  # the analysis's own load/extract/geometry time is kept apart
    assert set(after["geometry_timing"]) >= {"load_s", "extract_s", "geometry_s"}
    assert main(["geometry", str(tmp_path / "nothing")]) == 2
