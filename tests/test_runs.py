"""The run directory (headprobe/record/directory.py): atomic writes, what a read-only handle does, the checks on a
results.json read back, and that what a run writes is what docs/reference.md documents."""

import json
import math
import re
from pathlib import Path

import pytest
import torch

from headprobe import run
from headprobe.record import directory as runs
from headprobe.record.directory import (
    SCHEMA_VERSION,
    RunDir,
    atomic_write_text,
    default_run_dir,
    metrics_from_json,
    new_results,
    read_results,
)

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "reference.md"


def documented() -> tuple[dict, set[str]]:
    """The results.json example of docs/reference.md, parsed, and the optional top-level keys it lists in backquotes."""
    text = REFERENCE.read_text()
    block = re.search(r"`results.json`\n```json\n(.*?)\n```", text, re.S).group(1)
    optional = text[text.index("Written by some runs only:"):].split("\n\n")[0]
    return json.loads(block), set(re.findall(r"`([a-z_]+)`", optional))


@pytest.mark.slow
def test_design_documents_every_key_a_run_writes(tiny_recipe, tmp_path):
    example, optional = documented()
    assert example["schema_version"] == SCHEMA_VERSION
    assert set(new_results({})) <= set(example) | optional
    recipe = {**tiny_recipe, "heads": [{"name": "relu", "act": "relu", "width": 16}],
              "augment": {"preset": "crop-flip", "views": 2}, "train": {"epochs": 1, "batch_size": 50},
              "probes": {"linear": {"C_grid": [1.0]}, "invariance": {}}, "report": False}
    results = run(recipe, out=tmp_path / "r", quiet=True).data
    assert set(results) <= set(example) | optional, set(results) - set(example) - optional
    tap_keys = set().union(*(set(t) for t in example["taps"].values()))
    for name, tap in results["taps"].items():
        assert set(tap) <= tap_keys, (name, set(tap) - tap_keys)
    evidence_keys = set(example["buffer"]["mlp_swish"]["evidence"]["linear.acc"]) | {
        "method", "n_boot", "why_unresolved", "margin_seeds"}
    for entry in results["buffer"]["relu"]["evidence"].values():
        assert set(entry) <= evidence_keys, set(entry) - evidence_keys
    assert set(results["buffer"]["relu"]) <= set(example["buffer"]["mlp_swish"])


def test_atomic_write_creates_the_folder_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "deep" / "er" / "results.json"
    atomic_write_text(target, "first")
    atomic_write_text(target, "second ✓")
    assert target.read_text(encoding="utf-8") == "second ✓"
    assert [p.name for p in target.parent.iterdir()] == ["results.json"]


def test_write_results_stores_plain_json_and_leaves_no_temporary(tmp_path):
    run_dir = RunDir.create(tmp_path / "r")
    run_dir.write_results({"schema_version": 3, "status": "complete", "taps": {"backbone": {"metrics": {
        "linear.acc": torch.tensor(0.75), "rankme": float("nan"), "cond": float("inf")}}},
        "where": tmp_path, "shape": (2, 3), "ids": {1: "one"}})
    on_disk = json.loads(run_dir.results_path.read_text())
    assert on_disk["taps"]["backbone"]["metrics"] == {"linear.acc": 0.75, "rankme": None, "cond": None}
    assert on_disk["where"] == str(tmp_path) and on_disk["shape"] == [2, 3] and on_disk["ids"] == {"1": "one"}
    assert sorted(p.name for p in run_dir.path.iterdir()) == ["checkpoints", "plots", "results.csv", "results.json"]
    assert run_dir.read_results() == on_disk


def test_a_failed_results_write_during_a_run_records_the_failure_and_raises(tmp_path, monkeypatch):
    run_dir = RunDir.create(tmp_path / "r")
    real, calls = runs.atomic_write_text, []

    def disk_full_once(path, text):
        calls.append(text)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        real(path, text)

    monkeypatch.setattr(runs, "atomic_write_text", disk_full_once)
    with pytest.raises(OSError, match="No space left"):
        run_dir.write_results({**new_results({}), "taps": {"backbone": {"metrics": {"linear.acc": 0.5}}}})
    recorded = json.loads(run_dir.results_path.read_text())
    assert recorded["status"] == "failed" and recorded["error"]["stage"] == "writing results.json"
    assert "OSError" in recorded["error"]["message"] and recorded["taps"]["backbone"]["metrics"]["linear.acc"] == 0.5
    assert "\n" in calls[0] and "\n" not in calls[1]  # the second try is the compact form, not the indented one
    calls.clear()
    with pytest.raises(OSError):  # a finished run's record is not rewritten as failed
        run_dir.write_results({**recorded, "status": "complete"})
    assert len(calls) == 1 and json.loads(run_dir.results_path.read_text())["status"] == "failed"


def test_a_read_only_run_dir_writes_nothing(tmp_path):
    run_dir = RunDir.create(tmp_path / "r", writable=False)
    run_dir.write_config("seed: 1\n")
    run_dir.write_results({"status": "running"})
    run_dir.log_metrics({"stage": "train", "loss": 1.0})
    assert list(tmp_path.iterdir()) == []


def test_log_metrics_appends_one_timestamped_json_line_per_record(tmp_path):
    run_dir = RunDir.create(tmp_path / "r")
    run_dir.log_metrics({"stage": "train", "loss": torch.tensor(1.5)})
    run_dir.log_metrics({"stage": "train", "loss": float("nan")})
    lines = [json.loads(x) for x in (run_dir.path / "metrics.jsonl").read_text().splitlines()]
    assert [line["loss"] for line in lines] == [1.5, None]
    assert all(isinstance(line["time"], float) and line["stage"] == "train" for line in lines)


def test_default_run_dir_never_names_an_existing_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(runs.time, "strftime", lambda fmt: "20250101-120000")
    first = default_run_dir("study", root=tmp_path)
    assert first == tmp_path / "study-20250101-120000" and not first.exists()  # named, not created
    first.mkdir()
    second = default_run_dir("study", root=tmp_path)
    assert second == tmp_path / "study-20250101-120000-2"
    second.mkdir()
    assert default_run_dir("study", root=tmp_path) == tmp_path / "study-20250101-120000-3"
    assert default_run_dir("other", root=tmp_path) == tmp_path / "other-20250101-120000"


def _results_json(tmp_path, content) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    if isinstance(content, bytes):
        (run_dir / "results.json").write_bytes(content)
    else:
        (run_dir / "results.json").write_text(json.dumps(content))
    return run_dir


@pytest.mark.parametrize("content, words", [
    ([1, 2, 3], "holds a list, not the mapping of a run's results"),
    ("complete", "holds a str, not the mapping"),
    (None, "holds a NoneType, not the mapping"),
    ({"heads": [1]}, "'heads' is a list, not a mapping"),
    ({"taps": {"backbone": [0.5]}}, "tap 'backbone' is a list, not a mapping"),
    ({"taps": {"backbone": {"metrics": 0.5}}}, "taps.backbone.metrics is a float, not a mapping"),
    (b"{\"taps\": {", "is not valid JSON"),
    (b"\xff\xfe", "is not UTF-8 text (byte 0)"),
])
def test_read_results_refuses_what_is_not_a_run_record(content, words, tmp_path):
    with pytest.raises(ValueError, match=re.escape(words)):
        read_results(_results_json(tmp_path, content))


def test_read_results_accepts_a_minimal_record_and_says_when_there_is_none(tmp_path):
    record = {"schema_version": 3, "taps": {"backbone": {}}, "heads": None}
    assert read_results(_results_json(tmp_path, record)) == record
    with pytest.raises(FileNotFoundError, match="pass a run directory written by `headprobe run`"):
        read_results(tmp_path / "nothing")


def test_metrics_from_json_restores_nan_and_keeps_everything_else(tmp_path):
    run_dir = RunDir.create(tmp_path / "r")
    run_dir.write_results({"schema_version": 3,
                           "taps": {"backbone": {"head": None, "depth": 0,
                                                 "metrics": {"linear.acc": 0.5, "rankme": float("nan")}},
                                    "relu": {"head": "relu"}}})
    taps = metrics_from_json(run_dir.read_results()["taps"])
    backbone = taps["backbone"]
    assert backbone["metrics"]["linear.acc"] == 0.5 and math.isnan(backbone["metrics"]["rankme"])
    assert (backbone["head"], backbone["depth"]) == (None, 0)
    assert taps["relu"] == {"head": "relu", "metrics": {}}
    stored = {"backbone": {"metrics": {"knn.k5.acc": None}}}
    metrics_from_json(stored)
    assert stored["backbone"]["metrics"]["knn.k5.acc"] is None  # the input is not changed in place
