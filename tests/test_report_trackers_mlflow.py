"""`report_to: [mlflow]` end to end, offline: a tiny run logs into a file store in tmp, and the MLflow client reads back
the training curve, every tap's metrics with their interval ends, the verdict and the answers."""

import json

import pytest

from headprobe.report.trackers import final_values, mlflow_values, tap_key


def test_mlflow_gets_numbers_as_metrics_and_texts_as_tags_with_no_name_both_a_metric_and_a_folder():
    values = {"taps/mlp/linear.acc": 0.9, "taps/mlp/linear.acc/low": 0.8, "taps/mlp/linear.acc/high": 0.95,
              "taps/mlp/rankme/low": 1.0, "buffer/mlp": "buffer", "buffer/mlp/support": 2.0,
              "claims/Q-class/heads/mlp/answer": "lost"}
    numbers, texts = mlflow_values(values)
    assert numbers == {"taps/mlp/linear.acc": 0.9, "taps/mlp/linear.acc.low": 0.8, "taps/mlp/linear.acc.high": 0.95,
                       "taps/mlp/rankme/low": 1.0,  # a metric named "low" whose folder holds no metric file: kept
                       "buffer/mlp/support": 2.0}
    assert texts == {"buffer/mlp": "buffer", "claims/Q-class/heads/mlp/answer": "lost"}


@pytest.mark.slow
def test_an_mlflow_file_store_holds_the_curves_the_final_metrics_and_the_answers(tiny_recipe, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from headprobe import run

    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for a database; its file store is offline
    recipe = {**tiny_recipe, "report_to": ["mlflow"], "augment": {"preset": "crop-flip", "views": 2},
              "heads": [{"name": "mlp", "width": 16}], "train": {"epochs": 3, "batch_size": 64, "log_every": 1}}
    run(recipe, out=tmp_path / "r", quiet=True)
    results = json.loads((tmp_path / "r" / "results.json").read_text())

    client = MlflowClient()
    (logged,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert logged.info.run_name == "r" and logged.info.status == "FINISHED"
    assert logged.data.params["train.epochs"] == "3" and logged.data.params["heads"].startswith("[{")
    records = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("stage") == "train"]
    assert len(train) >= 3
    curve = [(m.step, m.value) for m in client.get_metric_history(logged.info.run_id, "train/mlp/loss")]
    assert curve == [(r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in train]

    metrics, last_step = logged.data.metrics, train[-1]["step"]
    for tap, entry in results["taps"].items():
        for metric, value in entry["metrics"].items():
            key = f"taps/{tap_key(tap)}/{metric}"
            assert metrics[key] == pytest.approx(value, rel=1e-6), key
            ci = (entry["uncertainty"].get(metric) or {}).get("ci95")
            if ci is not None:
                assert [metrics[f"{key}.low"], metrics[f"{key}.high"]] == pytest.approx(ci, rel=1e-6), key
    (final,) = client.get_metric_history(logged.info.run_id, "taps/mlp/layer1/knn.k5.acc.low")
    assert final.step == last_step  # the final numbers at the last training step, as for W&B

    tags, answer = logged.data.tags, results["claims"]["Q-class"]["heads"]["mlp"]
    assert tags["buffer/mlp"] == results["buffer"]["mlp"]["verdict"]
    assert tags["claims/Q-class/heads/mlp/answer"] == answer["answer"]
    assert tags["claims/Q-class/heads/mlp/line"] == answer["line"]
    assert metrics["claims/Q-class/heads/mlp/change"] == pytest.approx(answer["change"], rel=1e-6)
    numbers, texts = mlflow_values(final_values(results))
    assert numbers.keys() <= metrics.keys() and texts.items() <= tags.items()  # everything sent arrived
