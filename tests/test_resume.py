"""`headprobe run --resume --out DIR` guesses right (headprobe/pipeline/resume.py, cli.py, record/writer.py): without
a recipe a run continues from its config.yaml and a sweep's folder continues its unfinished runs, with the numbers
of runs never interrupted; the sweep's own recipe resumes the sweep too; a recipe that differs is refused with the
keys that differ."""

from __future__ import annotations

import importlib
import json

import pytest

from headprobe import run
from headprobe.cli import main
from headprobe.pipeline.compose import run_sweep
from headprobe.record.writer import differing_keys

KNN = importlib.import_module("headprobe.probes.knn")


def _stop_at_knn(monkeypatch) -> None:
    """Ctrl-C in the first k-NN probe: the run stops "interrupted" with its linear probes done."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(KNN, "knn", interrupted)


def _metrics(path) -> dict:
    results = json.loads((path / "results.json").read_text())
    return {"status": results["status"], "taps": {t: tap["metrics"] for t, tap in results["taps"].items()}}


@pytest.mark.slow
def test_resume_without_a_recipe_continues_the_run_from_its_config(tiny_recipe, tmp_path, monkeypatch, capsys):
    reference = run(tiny_recipe, out=tmp_path / "reference", quiet=True).path
    _stop_at_knn(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_recipe, out=tmp_path / "r", quiet=True)
    assert _metrics(tmp_path / "r")["status"] == "interrupted"
    monkeypatch.undo()
    assert main(["run", "--resume", "--out", str(tmp_path / "r")]) == 0
    assert _metrics(tmp_path / "r") == _metrics(reference)
    assert main(["run", "--out", str(tmp_path / "r")]) == 2  # no recipe and no --resume: nothing to guess
    assert "headprobe run --resume --out DIR" in capsys.readouterr().err


@pytest.mark.slow
def test_a_sweep_folder_resumes_its_unfinished_runs_with_or_without_its_recipe(tiny_recipe, tmp_path, monkeypatch):
    recipe = {**tiny_recipe, "sweep": {"probes.linear.C_grid": [[0.1], [1.0]]}}
    calls, real = [], KNN.knn

    def counted(*args, **kwargs):
        calls.append(1)
        if stop_after is not None and len(calls) > stop_after:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(KNN, "knn", counted)
    stop_after = None
    first = run_sweep(recipe, out=tmp_path / "reference", quiet=True)[0].path.name
    calls.clear()
    run(tmp_path / "reference" / first / "config.yaml", out=tmp_path / "count", quiet=True)
    stop_after = len(calls)  # the k-NN calls of the first run: the sweep stops in the second
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        run_sweep(recipe, out=tmp_path / "s", quiet=True)
    monkeypatch.undo()
    names = sorted(p.name for p in (tmp_path / "reference").iterdir() if p.is_dir())
    reference = {name: _metrics(tmp_path / "reference" / name) for name in names}
    assert [_metrics(tmp_path / "s" / name)["status"] for name in names] == [
        "complete" if name == first else "interrupted" for name in names]
    done = json.loads((tmp_path / "s" / first / "results.json").read_text())
    assert main(["run", "--resume", "--out", str(tmp_path / "s")]) == 0
    assert {name: _metrics(tmp_path / "s" / name) for name in names} == reference
    assert json.loads((tmp_path / "s" / first / "results.json").read_text()) == done  # a finished run is kept
    assert (tmp_path / "s" / "compare.csv").is_file()
    # The sweep's own recipe resumes it too (every run is complete now: nothing is redone).
    assert sorted(r.path.name for r in run_sweep(recipe, out=tmp_path / "s", resume=True, quiet=True)) == names
    assert json.loads((tmp_path / "s" / first / "results.json").read_text()) == done


def test_a_recipe_mismatch_names_the_keys_that_differ():
    recorded = {"name": "r", "train": {"epochs": 5, "lr": 0.1}, "probes": {"linear": {}}}
    given = {"name": "r", "train": {"epochs": 2, "lr": 0.1}, "probes": {"linear": {}, "knn": {}}}
    assert differing_keys(recorded, given) == ["train.epochs (recorded 5, now 2)",
                                               "probes.knn (absent from the record, now {})"]
    assert differing_keys(given, given) == []


@pytest.mark.slow
def test_resuming_with_another_recipe_says_which_keys_differ(tiny_recipe, tmp_path, capsys):
    run(tiny_recipe, out=tmp_path / "r", quiet=True)
    other = tmp_path / "other.yaml"  # JSON is YAML
    other.write_text(json.dumps({**tiny_recipe, "data": {**tiny_recipe["data"], "limit": {"train": 100, "test": 80}}}))
    assert main(["run", str(other), "--resume", "--out", str(tmp_path / "r")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "data.limit.train (recorded 200, now 100)" in err and "headprobe run --resume --out" in err
