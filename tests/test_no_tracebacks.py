"""No tracebacks (issue #18): each of these exits 2 (arguments/recipe) or 1 (runtime) with one sentence, and
nothing the user had is lost or clobbered."""

import json
import os

import pytest
import yaml

from headprobe.cli import main
from headprobe.recipe import expand_sweep


def _tiny(**extra) -> dict:
    return {"name": "tiny", "backbone": {"id": "scratch:vit-tiny", "pooling": "cls"},
            "data": {"source": "sklearn-digits", "limit": {"train": 120, "test": 60}},
            "features": {"batch_size": 60}, "probes": {"linear": {"C_grid": [1.0]}, "knn": {"ks": [5]}},
            "report": False, **extra}


def _write(tmp_path, recipe, name="recipe.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(recipe))
    return path


def _one_sentence(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("error:"), err
    return " ".join(err.split())


def test_out_into_a_folder_that_is_not_a_run_is_refused(tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("my notes")
    (folder / "config.yaml").write_text("mine: true\n")
    assert main(["run", str(_write(tmp_path, _tiny())), "--out", str(folder)]) == 2
    assert "is a folder that is not a headprobe run (it holds 'notes.txt')" in _one_sentence(capsys)
    assert (folder / "config.yaml").read_text() == "mine: true\n"
    assert sorted(p.name for p in folder.iterdir()) == ["config.yaml", "notes.txt"]


def test_out_under_a_file_or_unwritable_exits_2(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    recipe = str(_write(tmp_path, _tiny()))
    assert main(["run", recipe, "--out", str(blocker / "run")]) == 2
    assert "is a file, not a folder" in _one_sentence(capsys)
    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode: os.fspath(path) != str(locked))  # chmod binds no root
    for out in (locked, locked / "new"):
        assert main(["run", recipe, "--out", str(out)]) == 2
        assert "not writable; choose a folder you can write to" in _one_sentence(capsys)
    assert list(locked.iterdir()) == []


@pytest.mark.slow
def test_a_write_failure_during_the_run_exits_1_records_it_and_leaves_no_temporaries(tmp_path, capsys, monkeypatch):
    from headprobe.record import directory as runs

    real = runs.atomic_write_text
    calls = {"n": 0}

    def full_disk(path, text):
        calls["n"] += 1
        if calls["n"] == 2:  # the results.json written after loading: the disk fills up
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(text[: len(text) // 2])
            try:
                raise OSError(28, "No space left on device", str(tmp))
            finally:
                tmp.unlink()
        return real(path, text)

    monkeypatch.setattr(runs, "atomic_write_text", full_disk)
    out = tmp_path / "run"
    assert main(["run", str(_write(tmp_path, _tiny())), "--out", str(out)]) == 1
    assert "No space left on device; free disk space or choose a writable --out" in _one_sentence(capsys)
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "failed" and "No space left" in results["error"]["message"]
    assert not [p for p in out.rglob("*.tmp")]


def test_atomic_write_removes_its_temporary_when_the_write_fails(tmp_path, monkeypatch):
    from pathlib import Path

    from headprobe.record.directory import atomic_write_text

    target = tmp_path / "results.json"
    target.write_text("old")

    def fail(self, *args, **kwargs):
        Path.write_bytes(self, b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", fail)
    with pytest.raises(OSError):
        atomic_write_text(target, "new")
    monkeypatch.undo()
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


@pytest.mark.parametrize("content, words", [
    ([1, 2, 3], "holds a list, not the mapping of a run's results"),
    ({"taps": [1]}, "'taps' is a list, not a mapping"),
    ({"taps": {"backbone": 3}}, "tap 'backbone' is a int, not a mapping"),
    ({"taps": {"backbone": {"metrics": [0.5]}}}, "taps.backbone.metrics is a list, not a mapping"),
])
def test_report_and_compare_on_a_malformed_results_json_exit_2(content, words, tmp_path, capsys):
    run = tmp_path / "a"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(content))
    assert main(["report", str(run)]) == 2
    assert words in _one_sentence(capsys)
    assert main(["compare", str(run), "--out", str(tmp_path)]) == 2
    assert words in _one_sentence(capsys)
    (run / "results.json").write_bytes(b"\xff\xfe garbage")
    assert main(["report", str(run)]) == 2
    assert "is not UTF-8 text" in _one_sentence(capsys)


def test_report_skips_non_utf8_garbage_in_metrics_jsonl(tmp_path, capsys):
    from headprobe.report.plots import read_records

    run = tmp_path / "a"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"schema_version": 3, "status": "complete",
                                                  "taps": {"backbone": {"metrics": {}}}}))
    (run / "metrics.jsonl").write_bytes(b'{"stage": "probe", "x": 1}\n\xff\xfe\x00garbage\x80\n{"stage": "t"}\n{"half')
    assert read_records(run) == [{"stage": "probe", "x": 1}, {"stage": "t"}]
    assert main(["report", str(run)]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_sweep_value_with_a_long_folder_name_is_shortened_with_a_hash():
    long = ["a" * 300, "a" * 299 + "b"]
    combos = expand_sweep({"sweep": {"name": ["x" * 120, "x" * 119 + "y"]}})
    assert [label for label, _ in combos] == ["name=" + "x" * 120, "name=" + "x" * 119 + "y"]
    from headprobe.recipe import sweep_folder_name

    names = [sweep_folder_name(f"note={v}") for v in long]
    assert all(len(n.encode()) <= 255 for n in names) and names[0] != names[1]
    assert sweep_folder_name("é" * 200).encode().decode() and len(sweep_folder_name("é" * 200).encode()) <= 200


@pytest.mark.slow
def test_resume_of_a_failed_run_with_a_null_metric(tmp_path, capsys):
    recipe = _write(tmp_path, _tiny(probes={"linear": {"C_grid": [1.0]}, "knn": {"ks": [5]}, "spectrum": {}}))
    out = tmp_path / "run"
    assert main(["run", str(recipe), "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    results["status"] = "failed"
    metrics = results["taps"]["backbone"]["metrics"]
    for key in list(metrics)[:3]:
        metrics[key] = None  # NaN, as JSON stores it
    del results["taps"]["backbone"]["protocol"]["spectrum"]
    (out / "results.json").write_text(json.dumps(results))
    capsys.readouterr()
    assert main(["run", str(recipe), "--out", str(out), "--resume"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert json.loads((out / "results.json").read_text())["status"] == "complete"


def test_compare_without_out_says_where_it_writes_first(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("x/a", "y/b"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "results.json").write_text(json.dumps({"schema_version": 3,
                                                                           "taps": {"backbone": {"metrics": {}}}}))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["compare", str(tmp_path / "runs/x/a"), str(tmp_path / "runs/y/b")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"writing compare.csv and compare.html into {(tmp_path / 'runs').resolve()}"
    assert (tmp_path / "runs" / "compare.csv").exists() and list((tmp_path / "elsewhere").iterdir()) == []


def test_a_single_class_imagefolder_says_so(tmp_path):
    from PIL import Image

    from headprobe.data import load_data
    from headprobe.data.sources import DataSourceError
    from headprobe.recipe import DataSpec

    (tmp_path / "only" / "cat").mkdir(parents=True)
    for i in range(4):
        Image.new("RGB", (8, 8), (i, i, i)).save(tmp_path / "only" / "cat" / f"{i}.png")
    with pytest.raises(DataSourceError, match="holds one class folder.*at least 2 classes"):
        load_data(DataSpec(source=f"imagefolder:{tmp_path / 'only'}"))


@pytest.mark.parametrize("version", [2, None])
@pytest.mark.parametrize("command", ["report", "claims", "compare", "export-heads", "geometry", "resume"])
def test_a_run_written_before_schema_3_is_refused_by_every_reader_with_exit_2(command, version, tmp_path, capsys):
    run = tmp_path / "old"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(_tiny()))
    record = {"headprobe_version": "0.0.9", "status": "failed", "recipe": _tiny(),
              "taps": {"backbone": {"metrics": {}}}, "heads": {}, "buffer": {}}
    record |= {} if version is None else {"schema_version": version}
    (run / "results.json").write_text(json.dumps(record))
    before = sorted(p.name for p in run.iterdir())
    argv = {"report": ["report", str(run)], "claims": ["claims", str(run)],
            "compare": ["compare", str(run), "--out", str(tmp_path / "cmp")],
            "export-heads": ["export-heads", str(run)], "geometry": ["geometry", str(run)],
            "resume": ["run", "--resume", "--out", str(run)]}[command]
    assert main(argv) == 2
    written = "no schema_version" if version is None else "schema_version 2"
    assert (f"{run / 'results.json'} has {written} (headprobe 0.0.9), and this headprobe reads only schema_version 3: "
            "run the study again with this version") in _one_sentence(capsys)
    assert sorted(p.name for p in run.iterdir()) == before and json.loads((run / "results.json").read_text()) == record
