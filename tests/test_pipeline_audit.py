"""`run`: keyword overrides, resuming a finished or partial run, and the top-level API names."""

import importlib
import json

import pytest

from headprobe.pipeline import RunError, run
from headprobe.recipe import RecipeError


def _tiny(**extra) -> dict:
    return {"name": "tiny", "backbone": {"id": "scratch:vit-tiny", "pooling": "cls"},
            "data": {"source": "sklearn-digits", "limit": {"train": 120, "test": 60}},
            "features": {"batch_size": 60}, "probes": {"linear": {"C_grid": [0.1, 1.0]}, "knn": {"ks": [5]}},
            "report": False, **extra}


HEADS = {"heads": [{"name": "relu", "width": 16}], "augment": {"preset": "crop-flip", "views": 2},
         "train": {"epochs": 1, "batch_size": 40}}


def test_keyword_overrides_are_python_values(tmp_path):
    import yaml

    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(_tiny()))
    with pytest.raises(RecipeError, match=r"train\.epochs = 0 is out of range"):
        run(path, out=tmp_path / "never", train__epochs=0)
    with pytest.raises(RecipeError, match=r"train\.epochs = 0 is out of range"):
        run(path, out=tmp_path / "never", **{"train.epochs": 0})
    assert not (tmp_path / "never").exists()
    results = run(path, out=tmp_path / "r", quiet=True, overrides=["seed=1", "probes.knn.ks=[7]"],
                  name="on", data__limit__test=50, **{"probes.knn.ks": [3], "train.epochs": 2})
    recipe = results["recipe"]
    # "on" would be YAML true; keywords apply after overrides=[...]
    assert (recipe["name"], recipe["seed"], recipe["train"]["epochs"]) == ("on", 1, 2)
    assert recipe["probes"]["knn"]["ks"] == [3] and recipe["data"]["limit"]["test"] == 50
    assert results["data"]["n_test"] == 50 and "knn.k3.acc" in results.metrics()


def test_resuming_a_finished_run_changes_nothing(tmp_path, capsys):
    out = tmp_path / "r"
    first = run(_tiny(**HEADS), out=out, quiet=True)
    recorded = (out / "results.json").read_bytes()
    metrics = (out / "metrics.jsonl").read_bytes()
    assert {"train_s", "probe_s"} <= set(first["timing"])
    again = run(_tiny(**HEADS), out=out, resume=True)
    assert "nothing to do" in capsys.readouterr().err
    assert (out / "results.json").read_bytes() == recorded and (out / "metrics.jsonl").read_bytes() == metrics
    assert again["timing"] == first["timing"] and again["status"] == "complete"
    assert again.metrics("relu") == first.metrics("relu")


def test_resuming_a_partial_run_keeps_the_time_of_finished_stages(tmp_path, monkeypatch):
    knn_module = importlib.import_module("headprobe.probes.knn")
    real, calls = knn_module.knn, []

    def fails_after_the_backbone(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise FloatingPointError("simulated failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(knn_module, "knn", fails_after_the_backbone)
    out = tmp_path / "r"
    with pytest.raises(RunError, match="simulated failure"):
        run(_tiny(**HEADS), out=out, quiet=True)
    partial = json.loads((out / "results.json").read_text())
    assert partial["status"] == "failed" and {"train_s", "probe_s"} <= set(partial["timing"])
    monkeypatch.undo()
    resumed = run(_tiny(**HEADS), out=out, resume=True, quiet=True)
    assert resumed["status"] == "complete"
    assert resumed["timing"]["train_s"] >= partial["timing"]["train_s"]  # training was not redone
    assert resumed["timing"]["probe_s"] >= partial["timing"]["probe_s"]  # nor the backbone's probes


def test_projection_head_is_importable_from_headprobe():
    import headprobe
    from headprobe import ProjectionHead
    from headprobe.heads import ProjectionHead as Direct

    assert ProjectionHead is Direct and "ProjectionHead" in headprobe.__all__


def test_colour_augmentations_are_inert_on_grey_images_only():
    import datasets
    import numpy as np
    from PIL import Image

    from headprobe.pipeline import grey_params

    grey = np.random.default_rng(0).integers(0, 255, (4, 8, 8), dtype=np.uint8)
    images = [Image.fromarray(g) for g in grey]  # mode "L", as sklearn-digits and Fashion-MNIST load
    inert = grey_params(datasets.Dataset.from_dict({"image": images, "label": [0, 1, 0, 1]}))
    assert set(inert) == {"saturation", "hue", "grayscale"} and "grey" in inert["hue"]
    colour = [Image.fromarray(np.stack([g, g, 255 - g], axis=-1)) for g in grey]
    assert grey_params(datasets.Dataset.from_dict({"image": colour, "label": [0, 1, 0, 1]})) is None


def test_an_interrupted_run_says_so_and_resumes(tmp_path, monkeypatch):
    knn_module = importlib.import_module("headprobe.probes.knn")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(knn_module, "knn", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(_tiny(), out=tmp_path / "r", quiet=True)
    partial = json.loads((tmp_path / "r" / "results.json").read_text())
    assert partial["status"] == "interrupted" and partial["error"]["stage"] == "running probe 'knn' on tap 'backbone'"
    assert "--resume --out" in partial["error"]["message"] and "linear.acc" in partial["taps"]["backbone"]["metrics"]
    monkeypatch.undo()
    assert run(_tiny(), out=tmp_path / "r", resume=True, quiet=True)["status"] == "complete"


def test_run_sweep_takes_keyword_overrides(tmp_path):
    from headprobe.pipeline import run_sweep

    recipe = _tiny(sweep={"backbone.pooling": ["cls", "mean"]})
    runs = run_sweep(recipe, out=tmp_path / "sw", quiet=True, probes__knn__ks=[3], data__limit__test=40)
    assert [r.path.name for r in runs] == ["pooling=cls", "pooling=mean"]
    for r in runs:
        assert r["recipe"]["probes"]["knn"]["ks"] == [3] and r["recipe"]["data"]["limit"]["test"] == 40
        assert "knn.k3.acc" in r.metrics()
    assert (tmp_path / "sw" / "compare.csv").is_file()
