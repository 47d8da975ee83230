"""`report_to`: training curves and every tap's final metrics with intervals reach the experiment trackers (TensorBoard
event files read back; W&B through Accelerate's tracker on a stand-in module), offline."""

import json
import sys
import types
from importlib.machinery import ModuleSpec

import pytest
from report_run import results_dict

from headprobe.recipe import RecipeError, load_recipe
from headprobe.recipe import trackers as recipe_trackers
from headprobe.record.directory import RunDir
from headprobe.report.trackers import curve_values, final_values, tap_key, tracking


def test_final_values_hold_every_metric_with_its_interval_and_the_verdicts():
    results = results_dict()
    results["taps"]["mlp@1"]["uncertainty"] = {"linear.acc": {"ci95": [0.9, 0.95]}, "rankme": {"ci95": None}}
    results["taps"]["backbone"]["metrics"]["cond"] = float("nan")
    results["claims"] = {"5": {"answer": "supported", "margin": 0.12, "tap": "mlp"}}
    values = final_values(results)
    assert values["taps/mlp/layer1/linear.acc"] == 0.93
    assert (values["taps/mlp/layer1/linear.acc/low"], values["taps/mlp/layer1/linear.acc/high"]) == (0.9, 0.95)
    assert "taps/mlp/layer1/rankme/low" not in values and "taps/backbone/cond" not in values  # no interval; NaN
    expected = {f"taps/{tap_key(t)}/{m}" for t, e in results["taps"].items() for m, v in e["metrics"].items()
                if v == v}
    assert expected <= set(values)
    assert values["buffer/mlp"] == "buffer" and values["buffer/lin/against"] == 1.0
    assert values["claims/5/answer"] == "supported" and values["claims/5/margin"] == 0.12
    assert tap_key("mlp@2") == "mlp/layer2" and tap_key("backbone") == "backbone"


def test_curves_come_from_training_and_geometry_records_only():
    record = {"stage": "train", "head": "mlp", "step": 40, "epoch": 3, "seed": 1, "loss": 2.5,
              "terms": {"vicreg.sim": 0.5}, "status": "training", "time": 1.0}
    assert curve_values(record) == ({"train/mlp/seed-1/loss": 2.5, "train/mlp/seed-1/terms/vicreg.sim": 0.5}, 40)
    assert curve_values({"stage": "probe", "tap": "mlp", "probe": "knn", "knn.k5.acc": 0.5}) is None


def test_a_tracker_that_is_not_installed_is_refused_before_anything_runs(monkeypatch):
    monkeypatch.setitem(recipe_trackers.TRACKER_MODULES, "mlflow", "no_such_module_31b")
    with pytest.raises(RecipeError, match=r"report_to = \['mlflow'\] needs mlflow-skinny, which is not installed; "
                                          r"`pip install mlflow-skinny`"):
        load_recipe({"report_to": ["mlflow"]})
    with pytest.raises(RecipeError, match="is not allowed; allowed: tensorboard, wandb, mlflow"):
        load_recipe({"report_to": ["tensorbord"]})


def test_mlflow_without_a_store_it_can_open_is_refused_before_anything_runs(monkeypatch):
    """mlflow-skinny without MLFLOW_TRACKING_URI: MLflow 3's default sqlite store needs SQLAlchemy, missing here."""
    monkeypatch.setitem(recipe_trackers.TRACKER_MODULES, "mlflow", "json")  # "installed"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    real = recipe_trackers.importlib.util.find_spec
    monkeypatch.setattr(recipe_trackers.importlib.util, "find_spec",
                        lambda name, *a: None if name == "sqlalchemy" else real(name, *a))
    with pytest.raises(RecipeError, match=r"MLFLOW_TRACKING_URI is not set .* set MLFLOW_TRACKING_URI to your "
                                          r"tracking server \(http://...\) or to a local folder"):
        load_recipe({"report_to": ["mlflow"]})
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "file:./mlruns")
    assert load_recipe({"report_to": ["mlflow"]}).report_to == ["mlflow"]
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.setattr(recipe_trackers.importlib.util, "find_spec",  # the full mlflow: SQLAlchemy is there
                        lambda name, *a: ModuleSpec(name, None) if name == "sqlalchemy" else real(name, *a))
    assert recipe_trackers.mlflow_store_problem({}) is None


class _Run:
    def __init__(self, calls):
        self.calls = calls

    def log(self, values, step=None):
        self.calls.append(("log", dict(values), step))

    def finish(self):
        self.calls.append(("finish",))


def test_wandb_gets_the_config_the_curves_and_the_final_numbers(tmp_path, monkeypatch):
    calls = []
    fake = types.ModuleType("wandb")
    fake.__spec__ = ModuleSpec("wandb", None)
    fake.config = types.SimpleNamespace(update=lambda values, allow_val_change=False: calls.append(("config", values)))
    fake.init = lambda **kwargs: calls.append(("init", kwargs)) or _Run(calls)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    recipe = load_recipe({"name": "study", "report_to": ["wandb"], "train": {"lr": 0.01}})
    run_dir = RunDir.create(tmp_path / "run-1")
    with tracking(recipe, run_dir) as trackers:
        run_dir.log_metrics({"stage": "train", "head": "mlp", "step": 10, "epoch": 0, "loss": 3.0})
        run_dir.log_metrics({"stage": "probe", "tap": "backbone", "probe": "knn", "knn.k5.acc": 0.5})
        trackers.log_results(results_dict())
    assert calls[0] == ("init", {"project": "study", "name": "run-1", "dir": str(tmp_path / "run-1")})
    assert calls[1][0] == "config" and calls[1][1]["train.lr"] == 0.01 and calls[1][1]["name"] == "study"
    assert calls[2] == ("log", {"train/mlp/loss": 3.0}, 10)  # the probe record is not a curve
    assert calls[3][0] == "log" and calls[3][1] == final_values(results_dict())
    assert calls[3][2] == 10  # at the last training step: W&B drops a step before its last one
    assert calls[4] == ("finish",) and len(calls) == 5
    assert run_dir.sinks == []  # detached when the run ends


def _wandb_records(path):
    """The protobuf records of an offline W&B run file (`run-*.wandb`): a 7-byte ':W&B' header, then LevelDB-style
    32 KiB blocks of chunks (crc32 4, length 2, type 1: full 1, first 2, middle 3, last 4)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, pos, pending = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending, pos = pending + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_wandb_offline_run_holds_the_curves_and_the_final_numbers(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    recipe = load_recipe({"name": "study", "report_to": ["wandb"], "train": {"lr": 0.01}})
    run_dir = RunDir.create(tmp_path / "run-1")
    with tracking(recipe, run_dir) as trackers:
        for step in (10, 20):
            run_dir.log_metrics({"stage": "train", "head": "mlp", "step": step, "epoch": 0, "loss": 3.0 / step})
        trackers.log_results(results_dict())
    wandb.teardown()  # the W&B service writes the run file on its own; this waits until it has
    (path,) = (tmp_path / "run-1" / "wandb").glob("offline-run-*/run-*.wandb")
    rows, config = [], {}
    for record in _wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
        elif record.WhichOneof("record_type") == "config":
            config |= {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.config.update}
    assert config["train.lr"] == 0.01 and config["name"] == "study"
    assert [(r["_step"], r.get("train/mlp/loss")) for r in rows] == [(10, 0.3), (20, 0.15)]
    final = rows[-1]  # the last step's row holds the final numbers too
    for key, value in final_values(results_dict()).items():
        assert final[key] == value, key


@pytest.mark.slow
def test_tensorboard_event_files_hold_the_curves_and_the_final_metrics(tiny_recipe, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from headprobe import run

    recipe = {**tiny_recipe, "report_to": ["tensorboard"], "augment": {"preset": "crop-flip", "views": 2},
              "heads": [{"name": "mlp", "width": 16}], "train": {"epochs": 3, "batch_size": 64, "log_every": 1}}
    results = run(recipe, out=tmp_path / "r", quiet=True)
    events = EventAccumulator(str(tmp_path / "r" / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    records = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("stage") == "train"]
    assert len(train) >= 3
    loss = [(e.step, e.value) for e in events.Scalars("train/mlp/loss")]
    assert loss == [(r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in train]
    scalars = set(events.Tags()["scalars"])
    for tap, entry in results["taps"].items():
        for metric, value in entry["metrics"].items():
            (point,) = events.Scalars(f"taps/{tap_key(tap)}/{metric}")
            assert point.value == pytest.approx(value, rel=1e-6)
            ci = (entry["uncertainty"].get(metric) or {}).get("ci95")
            if ci is not None:
                assert events.Scalars(f"taps/{tap_key(tap)}/{metric}/low")[0].value == pytest.approx(ci[0], rel=1e-6)
                assert events.Scalars(f"taps/{tap_key(tap)}/{metric}/high")[0].value == pytest.approx(ci[1], rel=1e-6)
    assert "taps/mlp/layer1/knn.k5.acc/low" in scalars
    texts = events.Tags()["tensors"]
    assert "buffer/mlp/text_summary" in texts
    assert results["buffer"]["mlp"]["verdict"] in events.Tensors("buffer/mlp/text_summary")[0].tensor_proto \
        .string_val[0].decode()
