"""The one writer of the run record (record/writer.py): what it writes where, and what a resumed run takes."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

from headprobe.recipe import RecipeError
from headprobe.record.directory import RunDir
from headprobe.record.writer import RecordWriter, TapSummary, unit_key
from headprobe.stats.bootstrap import TEST_IMAGES, PerUnit

RECIPE = {"name": "x", "seed": 0, "runtime": {"threads": None}}


def _writer(path, resume: bool = False, recipe: dict = RECIPE) -> RecordWriter:
    record, invocation, finished = RecordWriter.begin(recipe, path, resume, refuse_existing=True)
    assert finished is None
    writer = RecordWriter(RunDir.create(path), record, invocation, resume=resume)
    writer.write_interval_s = 0.0  # every probe writes at once: these tests place an interrupt inside that write
    return writer


def _output(value: float) -> SimpleNamespace:
    return SimpleNamespace(metrics={"linear.acc": value}, protocol={"C": 1.0},
                           per_unit={"linear.acc": PerUnit(torch.tensor([1.0, 0.0, 1.0]), TEST_IMAGES)})


def test_a_probe_goes_to_results_json_metrics_jsonl_and_the_unit_s_store(tmp_path):
    writer = _writer(tmp_path)
    assert writer.open_unit("h", "h", 1, seed=2) == set()
    writer.probe("h", 2, "linear", _output(2 / 3), process=1)
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["taps"]["h"]["seeds"]["2"] == {"metrics": {"linear.acc": 2 / 3}, "protocol": {"linear": {"C": 1.0}}}
    logged = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert {k: logged[k] for k in ("stage", "tap", "seed", "probe", "process", "linear.acc")} == {
        "stage": "probe", "tap": "h", "seed": 2, "probe": "linear", "process": 1, "linear.acc": 2 / 3}
    assert (tmp_path / "per_unit" / f"{unit_key('h', 2)}.safetensors").is_file()
    assert writer.open_unit("h", "h", 1, seed=2) == {"linear"}  # recorded: not pending any more


def test_a_resumed_run_takes_the_finished_taps_their_values_and_the_times_it_does_not_redo(tmp_path):
    first = _writer(tmp_path)
    first.open_unit("backbone", None, 0, None)
    first.probe("backbone", None, "linear", _output(math.nan))
    first.add_time({"probe_s": 4.0, "extract_s": 9.0})
    first.stop("interrupted", "running probe 'knn'", "interrupted (KeyboardInterrupt)")
    with pytest.raises(RecipeError, match="already holds a run; pass --resume"):
        RecordWriter.begin(RECIPE, tmp_path, resume=False, refuse_existing=True)
    with pytest.raises(RecipeError, match="the recipe differs"):
        RecordWriter.begin({**RECIPE, "seed": 1}, tmp_path, resume=True, refuse_existing=True)
    resumed = _writer(tmp_path, resume=True, recipe={**RECIPE, "runtime": {"threads": 4}})  # threads may differ
    assert math.isnan(resumed.record["taps"]["backbone"]["metrics"]["linear.acc"])  # null back to NaN
    assert resumed.record["timing"] == {"probe_s": 4.0}  # extraction is redone and re-timed
    assert [i["status"] for i in resumed.record["invocations"]] == ["interrupted", "running"]
    assert resumed.open_unit("backbone", None, 0, None) == {"linear"}
    assert torch.equal(resumed.per_unit["backbone"]["linear.acc"].values, torch.tensor([1.0, 0.0, 1.0]))
    resumed.complete(orbits={})
    record, _, finished = RecordWriter.begin(RECIPE, tmp_path, resume=True, refuse_existing=True)
    assert finished["status"] == "complete" and finished["invocations"][-1]["status"] == "complete"
    with pytest.raises(RecipeError, match="--resume needs --out pointing at an earlier run"):
        RecordWriter.begin(RECIPE, tmp_path / "none", resume=True, refuse_existing=True)


def test_an_analysis_of_a_finished_run_keeps_its_timing_and_status(tmp_path):
    writer = _writer(tmp_path)
    writer.add_time({"probe_s": 4.0})
    writer.complete(orbits={})
    finished = json.loads((tmp_path / "results.json").read_text())
    analysis = RecordWriter(RunDir(tmp_path), finished, invocation=None, timing={})
    analysis.add_time({"load_s": 1.5})
    assert not analysis.stop("failed", "analysing", "boom")  # a recorded run's status stays
    analysis.put("geometry_from", "checkpoints/step-4.pt", write=False)
    analysis.put("geometry_timing", analysis.timing)
    again = json.loads((tmp_path / "results.json").read_text())
    assert again["timing"] == {"probe_s": 4.0} and again["geometry_timing"] == {"load_s": 1.5}
    assert again["status"] == "complete" and "error" not in again


def test_only_the_main_process_writes_though_every_process_keeps_the_record(tmp_path):
    record, invocation, _ = RecordWriter.begin(RECIPE, tmp_path, False, refuse_existing=True)
    other = RecordWriter(RunDir(tmp_path, writable=False), record, invocation)
    other.open_unit("backbone", None, 0, None)
    other.probe("backbone", None, "linear", _output(0.5))
    other.summary(TapSummary("backbone", {"linear.acc": {"ci95": [0.1, 0.9]}}), write=True)
    assert other.record["taps"]["backbone"]["uncertainty"]["linear.acc"]["ci95"] == [0.1, 0.9]
    assert list(tmp_path.iterdir()) == []


def _interrupt_saves(monkeypatch, times: int | None) -> None:
    """The per-unit store's write cut short by Ctrl-C the first `times` times (None: every time)."""
    import headprobe.record.writer as writer_module

    real, calls = writer_module.save_per_unit, {"n": 0}

    def save(path, per_unit):
        calls["n"] += 1
        if times is None or calls["n"] <= times:
            raise KeyboardInterrupt
        real(path, per_unit)

    monkeypatch.setattr(writer_module, "save_per_unit", save)


def test_ctrl_c_while_a_store_is_written_records_the_probe_with_its_values(tmp_path, monkeypatch):
    """The interrupt lands between the probe's line in metrics.jsonl and its store (what test_faults' Ctrl-C in
    probing hit once in CI): the stop writes the store before results.json, so the resumed run keeps the probe and
    its intervals."""
    writer = _writer(tmp_path)
    writer.open_unit("relu", "relu", 1, None)
    _interrupt_saves(monkeypatch, times=1)
    with pytest.raises(KeyboardInterrupt):
        writer.probe("relu", None, "linear", _output(2 / 3))
    assert writer.stop("interrupted", "probing", "interrupted (KeyboardInterrupt)")
    resumed = _writer(tmp_path, resume=True)
    assert resumed.open_unit("relu", "relu", 1, None) == {"linear"}
    assert torch.equal(resumed.per_unit["relu"]["linear.acc"].values, torch.tensor([1.0, 0.0, 1.0]))


def test_a_store_that_cannot_be_written_leaves_its_probe_out_of_results_json(tmp_path, monkeypatch):
    """No results.json lists a probe whose per-unit values are not on disk: a resumed run redoes it instead of
    recording its intervals as unavailable."""
    writer = _writer(tmp_path)
    writer.open_unit("relu", "relu", 1, None)
    writer.probe("relu", None, "knn", SimpleNamespace(metrics={"knn.k5.acc": 0.5}, protocol={}, per_unit={
        "knn.k5.acc": PerUnit(torch.tensor([1.0, 0.0]), TEST_IMAGES)}))
    _interrupt_saves(monkeypatch, times=None)
    with pytest.raises(KeyboardInterrupt):
        writer.probe("relu", None, "linear", _output(2 / 3))
    assert writer.stop("interrupted", "probing", "interrupted (KeyboardInterrupt)")
    written = json.loads((tmp_path / "results.json").read_text())["taps"]["relu"]
    assert written["metrics"] == {"knn.k5.acc": 0.5} and list(written["protocol"]) == ["knn"]
    monkeypatch.undo()
    resumed = _writer(tmp_path, resume=True)
    assert resumed.open_unit("relu", "relu", 1, None) == {"knn"}
    assert set(resumed.per_unit["relu"]) == {"knn.k5.acc"}


def test_probes_recorded_together_are_written_with_their_stores(tmp_path, monkeypatch):
    """Probes recorded with write=False (a shared probing stage) reach results.json only with their stores, however
    the next write of results.json comes."""
    writer = _writer(tmp_path)
    writer.open_unit("relu", "relu", 1, 0)
    writer.probe("relu", 0, "linear", _output(2 / 3), write=False)
    writer.add_time({"probe_s": 1.0})
    writer.write()  # the next write of results.json, whatever calls it
    assert (tmp_path / "per_unit" / f"{unit_key('relu', 0)}.safetensors").is_file()


def test_probe_outputs_wait_for_the_next_write_and_a_stop_or_flush_takes_them_along(tmp_path):
    """Within `write_interval_s` of the last write a probe's output waits (metrics.jsonl has it at once); `flush`
    writes it with its store, and so does a stop."""
    for ending in ("flush", "stop"):
        path = tmp_path / ending
        writer = _writer(path)
        writer.write_interval_s = 3600.0
        writer.open_unit("relu", "relu", 1, None)
        writer.probe("relu", None, "knn", SimpleNamespace(metrics={"knn.k5.acc": 0.5}, protocol={}, per_unit={}))
        writer.probe("relu", None, "linear", _output(2 / 3))
        assert list(json.loads((path / "results.json").read_text())["taps"]["relu"]["protocol"]) == ["knn"]
        assert [json.loads(line)["probe"] for line in (path / "metrics.jsonl").read_text().splitlines()] == [
            "knn", "linear"]
        if ending == "flush":
            writer.flush()
        else:
            assert writer.stop("interrupted", "probing", "interrupted (KeyboardInterrupt)")
        assert list(json.loads((path / "results.json").read_text())["taps"]["relu"]["protocol"]) == ["knn", "linear"]
        resumed = _writer(path, resume=True)
        assert resumed.open_unit("relu", "relu", 1, None) == {"knn", "linear"}
        assert torch.equal(resumed.per_unit["relu"]["linear.acc"].values, torch.tensor([1.0, 0.0, 1.0]))
