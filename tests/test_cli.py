"""`headprobe` on the command line: run/report/compare/list/validate/geometry end to end, and the contract: exit 2
on bad recipes/arguments (nothing written, message printed verbatim), exit 1 on failures while running, and
`headprobe geometry` never changing a recorded run's status."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from timeouts import HANG_TIMEOUT_S

from headprobe.cli import main

QUICKSTART = Path(__file__).resolve().parents[1] / "recipes" / "quickstart.yaml"


def _tiny(**extra) -> dict:
    return {"name": "tiny", "backbone": {"id": "scratch:vit-tiny", "pooling": "cls"},
            "data": {"source": "sklearn-digits", "limit": {"train": 120, "test": 60}},
            "features": {"batch_size": 60}, "probes": {"linear": {"C_grid": [0.1, 1.0]}, "knn": {"ks": [5]}},
            "report": False, **extra}


def _write(tmp_path, recipe, name="recipe.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.mark.slow
def test_run_report_compare_end_to_end(tiny_recipe, tmp_path, capsys):
    path = _write(tmp_path, {**tiny_recipe, "report": True})
    assert main(["run", str(path), "--out", str(tmp_path / "a"), "--set", "probes.knn.ks=[3]"]) == 0
    assert (tmp_path / "a" / "report.html").exists() and any((tmp_path / "a" / "plots").glob("*.png"))
    assert main(["run", str(path), "--out", str(tmp_path / "b"), "--set", "backbone.pooling=mean"]) == 0
    out = capsys.readouterr().out
    assert "linear.acc" in out and "knn.k3.acc" in out
    assert f"report: {tmp_path / 'a' / 'report.html'}" in out.splitlines()  # where to look, said at the end
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


@pytest.mark.slow
def test_module_entry_point():
    done = subprocess.run([sys.executable, "-m", "headprobe", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and "headprobe 0.1.0" in done.stdout


@pytest.mark.slow
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


@pytest.mark.slow
def test_geometry_of_a_finished_run_without_retraining(tiny_recipe, tmp_path, capsys):
    recipe = {**tiny_recipe, "probes": {"knn": {"ks": [5]}}, "heads": [{"name": "relu", "width": 16}],
              "augment": {"preset": "crop-flip", "views": 2}, "train": {"epochs": 1, "batch_size": 50},
              "geometry": {"saddle_states": 2}}
    path = _write(tmp_path, recipe)
    assert main(["run", str(path), "--out", str(tmp_path / "r")]) == 0
    before = json.loads((tmp_path / "r" / "results.json").read_text())
    assert before["heads"]["relu"]["geometry"] == {}
    capsys.readouterr()
    assert main(["geometry", str(tmp_path / "r"), "--rows", "16"]) == 0
    printed = capsys.readouterr()
    assert "relu: λ_min" in printed.out
    # the estimate comes first, before the backbone is loaded again, from the run's own seconds
    assert printed.err.startswith("geometry estimate: loading and extracting again ≤ ~")
    assert "then 1 head at 16 rows each" in printed.err.splitlines()[0]
    after = json.loads((tmp_path / "r" / "results.json").read_text())
    again = main(["geometry", str(tmp_path / "r"), "--rows", "16"])  # now timed: seconds per head from last time
    assert again == 0 and "s per head last time" in capsys.readouterr().err.splitlines()[0]
    assert after["heads"]["relu"]["geometry"]["effective_hessian"]["consistency"] < 1e-8
    # a ReLU+BN head: an M-term on batch statistics, none on running statistics (claim 3's BatchNorm caveat)
    split = after["claims"]["Q-split"]["heads"]["relu"]
    assert (split["answer"], split["secondary"]["m_share.running"]["answer"]) == ("M > 0", "M = 0")
    assert after["geometry_from"] == "checkpoints/step-4.pt"
    assert after["taps"] == before["taps"]
    assert after["timing"] == before["timing"]  # the analysis's own load/extract/geometry time is kept apart
    assert set(after["geometry_timing"]) >= {"load_s", "extract_s", "geometry_s"}
    assert main(["geometry", str(tmp_path / "nothing")]) == 2


def test_error_messages_with_brackets_are_printed_verbatim(capsys, tmp_path):
    assert main(["validate", str(QUICKSTART), "--set", "backbone.id=foo:bar"]) == 2
    err = capsys.readouterr().err
    assert "backbone.id = 'foo:bar'" in err and "open_clip:<arch>[/<pretrained tag or weights file>]" in err
    path = tmp_path / "bad.yaml"
    path.write_text("backbone: {pooling: [cls\n")
    assert main(["validate", str(path)]) == 2
    assert "[cls" in capsys.readouterr().err
    weird = tmp_path / "[bold]x.yaml"
    weird.write_text("seed: 1\n")
    assert main(["validate", str(weird)]) == 0
    assert "[bold]x.yaml" in capsys.readouterr().out


@pytest.mark.parametrize("override, words", [
    ("probes.orbits.sweeps=[rotation46]", ["probes.orbits.sweeps[0]", "'rotation46'", "Did you mean 'rotation45'"]),
    ("data.test_fraction=0", ["data.test_fraction", "(0, 1)"]),
    ("data.limit.train=200", ["train.batch_size = 256", "data.limit.train = 200"]),
    ("name=../../escape", ["name = '../../escape'", "[A-Za-z0-9]"]),
    ("name=a/b", ["name = 'a/b'"]),
])
def test_validate_refuses_what_run_would_refuse(override, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["validate", str(QUICKSTART), "--set", override]) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err
    assert main(["run", str(QUICKSTART), "--set", override]) == 2
    assert list(tmp_path.iterdir()) == []  # nothing written, not even runs/


def test_validate_checks_every_sweep_combination(tmp_path, capsys):
    heads = {"heads": [{"name": "a"}]}
    assert main(["validate", str(_write(tmp_path, {**heads, "sweep": {"heads.0.actt": ["relu"]}}))]) == 2
    assert "unknown key 'heads[0].actt'" in capsys.readouterr().err
    assert main(["validate", str(_write(tmp_path, {**heads, "sweep": {"heads.0.act": ["relu", "bogus"]}}))]) == 2
    assert "sweep combination act=bogus" in capsys.readouterr().err
    assert main(["validate", str(_write(tmp_path, {**heads, "sweep": {"heads.0.act": ["relu", "gelu"]}}))]) == 0
    assert "sweep: 2 runs" in capsys.readouterr().out


def test_duplicate_keys_and_empty_files_fail_validate(tmp_path, capsys):
    dup = tmp_path / "dup.yaml"
    dup.write_text("seed: 1\nseed: 2\n")
    assert main(["validate", str(dup)]) == 2
    assert "duplicate key 'seed' at line 2" in capsys.readouterr().err
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert main(["validate", str(empty)]) == 2
    assert "is empty" in capsys.readouterr().err


def test_out_that_is_a_file_exits_2_and_writes_nothing(tmp_path, capsys):
    path = _write(tmp_path, _tiny())
    target = tmp_path / "some_file"
    target.write_text("keep me")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["run", str(path), "--out", str(target)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert main(["run", str(path), "--out", str(target / "sub")]) == 2
    assert "which is a file" in capsys.readouterr().err
    assert target.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.slow
def test_geometry_bad_rows_and_failures_leave_the_run_status_alone(tmp_path, capsys, monkeypatch):
    recipe = _tiny(heads=[{"name": "relu", "width": 16}], augment={"preset": "crop-flip", "views": 2},
                   train={"epochs": 1, "batch_size": 40})
    path = _write(tmp_path, recipe)
    run_dir = tmp_path / "r"
    assert main(["run", str(path), "--out", str(run_dir)]) == 0
    results = run_dir / "results.json"
    before = results.read_bytes()
    assert json.loads(before)["status"] == "complete"
    for rows in ("0", "1", "-3"):
        assert main(["geometry", str(run_dir), "--rows", rows]) == 2
        assert f"--rows = {rows} is out of range" in capsys.readouterr().err
        assert results.read_bytes() == before
    import headprobe.pipeline.stages as stages

    def broken(*args, **kwargs):
        raise FloatingPointError("simulated geometry failure")

    monkeypatch.setattr(stages, "analyse_head", broken)  # the name the geometry stage calls
    assert main(["geometry", str(run_dir), "--rows", "16"]) == 1
    assert "simulated geometry failure" in capsys.readouterr().err
    after, recorded = json.loads(results.read_text()), json.loads(before)
    assert after["status"] == "complete" and "error" not in after
    assert after["heads"] == recorded["heads"] and after["taps"] == recorded["taps"]


def test_a_bad_recipe_is_reported_by_the_main_process_only(tmp_path, capsys, monkeypatch):
    path = _write(tmp_path, _tiny())
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert main(["run", str(path), "--set", "backbone.pooling=maen"]) == 2
    assert capsys.readouterr().err == ""  # the main process says it
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert main(["run", str(path), "--set", "backbone.pooling=maen"]) == 2
    assert capsys.readouterr().err.count("backbone.pooling") == 1


@pytest.mark.slow
@pytest.mark.distributed
def test_a_bad_recipe_under_torchrun_is_printed_once(tmp_path):
    import os
    import shutil

    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun missing")
    path = _write(tmp_path, _tiny())
    done = subprocess.run([torchrun, "--nproc_per_node", "2", "-m", "headprobe", "run", str(path), "--out",
                           str(tmp_path / "never"), "--set", "backbone.pooling=maen"],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=HANG_TIMEOUT_S)
    assert done.returncode != 0
    assert done.stderr.count("error: backbone.pooling") == 1, done.stderr[-3000:]
    assert not (tmp_path / "never").exists()
    # Each process exits 2 as one process would; torchrun stops a process still running once another has failed
    # (SIGTERM, -15 in its summary), so a rank may show that instead, but never 1 or a traceback's code.
    import re

    codes = [int(code) for code in re.findall(r"exitcode\s*:\s*(-?\d+)", done.stderr)]
    assert codes and 2 in codes and set(codes) <= {2, -15}, done.stderr[-3000:]


def test_transformers_bars_and_warnings_are_quiet_unless_asked():
    from transformers.utils import logging

    from headprobe.cli import quiet_libraries

    level, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    try:
        logging.set_verbosity_warning()
        logging.enable_progress_bar()
        assert quiet_libraries(True, {}) is False and quiet_libraries(False, {"HEADPROBE_VERBOSE": "1"}) is False
        assert logging.is_progress_bar_enabled() and logging.get_verbosity() == logging.WARNING
        environ: dict = {}
        assert quiet_libraries(False, environ) is True
        assert not logging.is_progress_bar_enabled() and logging.get_verbosity() == logging.ERROR
        assert environ["TRANSFORMERS_VERBOSITY"] == "error"  # for the processes a launcher starts from here
    finally:
        logging.set_verbosity(level)
        (logging.enable_progress_bar if bars else logging.disable_progress_bar)()
