"""`headprobe.run` and `run_sweep` end to end: the run directory, seeds and the feature cache, resuming a failed,
interrupted or finished run, keyword overrides, heads trained and every tap probed, geometry per head."""

import importlib
import json
import math

import pytest

from headprobe import run
from headprobe.pipeline.compose import RunError, run_sweep
from headprobe.recipe import RecipeError

pytestmark = pytest.mark.slow  # every test here trains or probes a backbone end to end


def _tiny(**extra) -> dict:
    """A scratch ViT (no checkpoint to build) on 120/60 digits."""
    return {"name": "tiny", "backbone": {"id": "scratch:vit-tiny", "pooling": "cls"},
            "data": {"source": "sklearn-digits", "limit": {"train": 120, "test": 60}},
            "features": {"batch_size": 60}, "probes": {"linear": {"C_grid": [0.1, 1.0]}, "knn": {"ks": [5]}},
            "report": False, **extra}


ONE_HEAD = {"heads": [{"name": "relu", "width": 16}], "augment": {"preset": "crop-flip", "views": 2},
            "train": {"epochs": 1, "batch_size": 40}}


def test_run_writes_the_run_directory(tiny_recipe, tmp_path):
    results = run(tiny_recipe, out=tmp_path / "r", quiet=True)
    files = {p.name for p in (tmp_path / "r").iterdir()}
    assert {"config.yaml", "results.json", "metrics.jsonl", "plots", "checkpoints"} <= files
    on_disk = json.loads((tmp_path / "r" / "results.json").read_text())
    assert on_disk["status"] == "complete" and on_disk["headprobe_version"] == "0.1.0"
    tap = on_disk["taps"]["backbone"]
    assert (tap["head"], tap["depth"]) == (None, 0)
    assert set(tap["metrics"]) >= {"linear.acc", "knn.k5.acc", "knn.k20.acc"}
    assert 0.0 <= tap["metrics"]["linear.acc"] <= 1.0
    assert tap["protocol"]["linear"]["C_grid"] == [0.01, 0.1, 1.0]
    assert tap["protocol"]["knn"]["temperature"] == 0.07
    assert on_disk["data"]["n_train"] == 200 and on_disk["backbone"]["dim"] == 32
    assert results.metrics() == tap["metrics"]
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [line["probe"] for line in lines] == ["linear", "knn"]


def test_same_seed_same_numbers_and_cache_reuse(tiny_recipe, tmp_path):
    a = run(tiny_recipe, out=tmp_path / "a", quiet=True)
    b = run(tiny_recipe, out=tmp_path / "b", quiet=True)
    assert a.metrics() == b.metrics()
    assert all(not c["hit"] for c in a["protocol"]["features"]["cache"].values())
    assert all(c["hit"] for c in b["protocol"]["features"]["cache"].values())


def test_existing_out_needs_resume_and_resume_keeps_finished_work(tiny_recipe, tmp_path, monkeypatch):
    knn_module = importlib.import_module("headprobe.probes.knn")

    def broken(*args, **kwargs):
        raise FloatingPointError("simulated failure")

    monkeypatch.setattr(knn_module, "knn", broken)
    with pytest.raises(RunError, match=r"while running probe 'knn'.*simulated failure.*partial results kept"):
        run(tiny_recipe, out=tmp_path / "r", quiet=True)
    partial = json.loads((tmp_path / "r" / "results.json").read_text())
    assert partial["status"] == "failed" and "linear.acc" in partial["taps"]["backbone"]["metrics"]
    monkeypatch.undo()
    with pytest.raises(RecipeError, match="already holds a run"):
        run(tiny_recipe, out=tmp_path / "r", quiet=True)
    with pytest.raises(RecipeError, match="recipe differs"):
        run({**tiny_recipe, "seed": 3}, out=tmp_path / "r", resume=True, quiet=True)
    resumed = run(tiny_recipe, out=tmp_path / "r", resume=True, quiet=True)
    assert resumed["status"] == "complete"
    assert resumed.metrics()["linear.acc"] == partial["taps"]["backbone"]["metrics"]["linear.acc"]
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["probe"] for x in lines] == ["linear", "knn"]  # linear was not rerun


HEADS_RECIPE = {
    "heads": [{"name": "lin", "type": "linear", "width": 16}, {"name": "relu", "act": "relu", "width": 16},
              {"name": "ident", "type": "identity"}],
    "objective": {"name": "vicreg"},
    "augment": {"preset": "crop-flip", "views": 2},
    "train": {"epochs": 2, "batch_size": 50, "log_every": 2, "checkpoint_every": 4},
}


def test_heads_are_trained_and_every_tap_probed(tiny_recipe, tmp_path):
    probes = {"linear": {"C_grid": [0.1, 1.0]}, "knn": {"ks": [5]}, "spectrum": {}, "invariance": {}, "view_mi": {},
              "augment_r2": {}, "rotation": {"C_grid": [1.0], "mlp_epochs": 10},
              "orbits": {"sweeps": ["rotation45", "blur", "hue"], "n_images": 6, "pca_images": 3}}
    recipe = {**tiny_recipe, **HEADS_RECIPE, "probes": probes}
    results = run(recipe, out=tmp_path / "r", quiet=True)
    taps = results["taps"]
    assert list(taps) == ["backbone", "lin@1", "lin", "relu@1", "relu", "ident"]
    assert (taps["relu@1"]["head"], taps["relu@1"]["depth"], taps["relu"]["depth"]) == ("relu", 1, 2)
    expected = {"linear.acc", "mi.label", "knn.k5.acc", "rankme", "alpha_req", "cond", "align", "uniform", "view_cos",
                "lidar", "mi.infonce", "mi.infonce.ceiling", "mi.gaussian", "aug_r2.mean", "aug_r2.crop_scale",
                "rotation.acc", "rotation.mlp.acc", "rotation45.orbit.spread_rel", "blur.orbit.curvature",
                "rotation45.orbit.d_ratio", "rotation45.orbit.d_ratio_image"}
    for name, tap in taps.items():
        assert expected <= set(tap["metrics"]), (name, expected - set(tap["metrics"]))
    # The view probes measure the 80 test images' views (augment.probe_views: test): InfoNCE's batch is 80 < 128.
    assert taps["backbone"]["metrics"]["mi.infonce.ceiling"] == pytest.approx(math.log(80))
    assert taps["ident"]["metrics"] == taps["backbone"]["metrics"]  # identity head = backbone features
    assert results["heads"]["relu"]["train"]["status"] == "complete"
    assert results["heads"]["relu"]["train"]["steps"] == 8
    # What the run concludes, and why. The identity head is the backbone: every margin is 0, nothing is resolved,
    # its class information is "equivalent" (a zero-width interval inside ±2 points) and the direction questions
    # stay "undecided". The trained heads end in 16 dimensions of a 32-d backbone after 2 epochs: both lose
    # rotation information (Q-aug yes: −8 and −13 points), the ReLU head 26 points of class accuracy as well
    # (Q-class lost), and both are "mixed" because their orbits under rotation and blur spread more than the
    # backbone's (resolved against) while the information they lost is resolved for.
    answers = {q: {h: record["answer"] for h, record in claim["heads"].items()}
               for q, claim in results["claims"].items()}
    assert answers == {"Q-aug": {"lin": "yes", "relu": "yes", "ident": "undecided"},
                       "Q-inv": {"lin": "undecided", "relu": "undecided", "ident": "undecided"},
                       "Q-class": {"lin": "undecided", "relu": "lost", "ident": "equivalent"}}
    ident = results["buffer"]["ident"]
    assert (ident["verdict"], ident["support"], ident["against"]) == ("inconclusive", 0, 0)
    assert all(entry["margin"] == 0 for entry in ident["evidence"].values())
    assert results["claims"]["Q-class"]["heads"]["ident"]["ci95"] == [0.0, 0.0]
    verdict = results["buffer"]["relu"]
    assert {h: v["verdict"] for h, v in results["buffer"].items()} == {"lin": "mixed", "relu": "mixed",
                                                                       "ident": "inconclusive"}
    resolved = {m: e["resolved"] for m, e in verdict["evidence"].items() if e["resolved"] != "unresolved"}
    assert resolved == {"linear.acc": "for", "knn.k5.acc": "for", "mi.label": "for", "rotation.acc": "for",
                        "rotation45.orbit.spread_rel": "against", "blur.orbit.spread_rel": "against"}
    for claim in results["claims"].values():  # each change within its own interval
        for record in claim["heads"].values():
            assert record["ci95"][0] <= record["change"] <= record["ci95"][1]
    assert {"linear.acc", "rotation.acc", "aug_r2.mean", "mi.label", "view_spread_rel",
            "knn.k5.acc"} <= set(verdict["evidence"])
    assert not {"align", "view_cos"} & set(verdict["evidence"])  # raw invariance: descriptions, not evidence
    paired = verdict["evidence"]["linear.acc"]
    assert paired["method"] == "paired bootstrap over test images" and paired["ci95"][0] <= paired["ci95"][1]
    assert verdict["evidence"]["aug_r2.mean"]["resolved"] == "unresolved"  # no per-unit values: no interval
    for name, tap in taps.items():
        unc = tap["uncertainty"]
        assert set(unc) == set(tap["metrics"]), name
        low, high = unc["knn.k5.acc"]["ci95"]
        assert low <= tap["metrics"]["knn.k5.acc"] <= high and unc["knn.k5.acc"]["n_units"] == 80
        assert unc["align"]["unit"] == "images with views" and unc["rankme"]["unit"] == "training images"
    assert (tmp_path / "r" / "per_unit" / "relu.safetensors").exists()
    orbit = taps["relu"]["protocol"]["orbits"]["sweeps"]["rotation45"]
    assert len(orbit["values"]) == 10 and len(orbit["pca"]) == 3 and len(orbit["pca"][0]) == 10
    assert "grey" in taps["relu"]["protocol"]["orbits"]["sweeps"]["hue"]["skipped"]  # digits have no hue
    assert "class centroids of the orbit images" in taps["relu"]["protocol"]["orbits"]["centroids"]
    cache = results["protocol"]["features"]["cache"]
    assert {"train", "test", "train-rot90", "test-rot270", "orbits-rotation45", "orbits-hue"} <= set(cache)
    assert results["protocol"]["views"]["views"] == 2 and results["protocol"]["train"]["objective"] == "vicreg"
    assert {p.name for p in (tmp_path / "r" / "checkpoints").iterdir()} == {"step-4.pt", "step-8.pt"}
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert {line["head"] for line in lines if line["stage"] == "train"} == {"lin", "relu"}
    again = run(recipe, out=tmp_path / "again", quiet=True)
    assert again["protocol"]["views"]["hit"] is True
    assert {t: v["metrics"] for t, v in again["taps"].items()} == {t: v["metrics"] for t, v in taps.items()}


def test_geometry_is_tracked_and_analysed_per_head(tiny_recipe, tmp_path):
    recipe = {**tiny_recipe, "probes": {"knn": {"ks": [5]}},
              "heads": [{"name": "swish", "act": "swish", "width": 16, "predictor": 8, "init_scale": 0.1}],
              "objective": {"name": "simsiam"}, "augment": {"preset": "crop-flip", "views": 2},
              "train": {"epochs": 2, "batch_size": 50, "log_every": 2},
              "geometry": {"final": True, "rows": 32, "track_every": 3, "track_rows": 16, "track_max_iter": 10,
                           "saddle_states": 2}}
    results = run(recipe, out=tmp_path / "g", quiet=True)
    split, saddle = results["claims"]["Q-split"]["heads"]["swish"], results["claims"]["Q-saddle"]
    assert split["answer"] == "M > 0" and split["n_units"] == 8 and split["predicted"] == "M > 0"
    assert len(saddle["states"]["simsiam"]) == 4 * 3 * 2  # head types × seeds × states
    assert {"Q-aug", "Q-class", "Q-split", "Q-saddle"} <= set(results["claims"])  # probing's answers kept
    geometry = results["heads"]["swish"]["geometry"]
    assert {"pullback", "augmentation", "effective_hessian", "curvature", "hessian_density"} <= set(geometry)
    assert geometry["effective_hessian"]["consistency"] < 1e-8  # G + M reproduces the dense Hessian
    assert geometry["curvature"]["n_hvp"] > 0 and "residual_min" in geometry["curvature"]
    density = geometry["hessian_density"]
    assert len(density["grid"]) == len(density["density"]) == 200
    lines = [json.loads(x) for x in (tmp_path / "g" / "metrics.jsonl").read_text().splitlines()]
    tracked = [line for line in lines if line["stage"] == "geometry"]
    assert [line["step"] for line in tracked] == [3, 6]
    assert all(line["lambda_min"] <= line["lambda_max"] for line in tracked)
    assert 0 < results["timing_ratios"]["track_over_train"] and results["timing"]["track_s"] > 0
    assert results["timing_ratios"]["probe_over_extract"] > 0
    assert not (tmp_path / "g" / "report.html").exists()  # report: false


def test_view_mi_with_a_trained_critic(tiny_recipe, tmp_path):
    # The views probed are the 80 test images': 40 critic-training pairs, split 30 / 10, so batches of 8.
    recipe = {**tiny_recipe, "probes": {"view_mi": {"critic": "separable", "critic_steps": 20, "batch_size": 8}},
              "augment": {"preset": "crop-flip", "views": 2}}
    results = run(recipe, out=tmp_path / "mi", quiet=True)
    metrics, protocol = results.metrics(), results["taps"]["backbone"]["protocol"]["view_mi"]
    assert metrics["mi.infonce"] <= metrics["mi.infonce.ceiling"] == pytest.approx(math.log(8))
    assert protocol["infonce"]["critic"] == "separable" and protocol["infonce"]["n_train"] > 0


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
    first = run(_tiny(**ONE_HEAD), out=out, quiet=True)
    recorded = (out / "results.json").read_bytes()
    metrics = (out / "metrics.jsonl").read_bytes()
    assert {"train_s", "probe_s"} <= set(first["timing"])
    again = run(_tiny(**ONE_HEAD), out=out, resume=True)
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
        run(_tiny(**ONE_HEAD), out=out, quiet=True)
    partial = json.loads((out / "results.json").read_text())
    assert partial["status"] == "failed" and {"train_s", "probe_s"} <= set(partial["timing"])
    monkeypatch.undo()
    resumed = run(_tiny(**ONE_HEAD), out=out, resume=True, quiet=True)
    assert resumed["status"] == "complete"
    assert resumed["timing"]["train_s"] >= partial["timing"]["train_s"]  # training was not redone
    assert resumed["timing"]["probe_s"] >= partial["timing"]["probe_s"]  # nor the backbone's probes


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


@pytest.mark.parametrize("error", [KeyboardInterrupt, ZeroDivisionError], ids=["ctrl-c", "failure"])
def test_a_stop_between_stages_is_recorded_too(tmp_path, monkeypatch, error):
    """A Ctrl-C or failure outside any stage (here while a head's verdict is decided, after its probes) is
    recorded with the last stage begun, and --resume finishes the run without redoing the probes."""
    buffer_module = importlib.import_module("headprobe.stats.verdict")

    def stops(*args, **kwargs):
        raise error("simulated")

    monkeypatch.setattr(buffer_module, "buffer_verdict", stops)
    out = tmp_path / "r"
    with pytest.raises(KeyboardInterrupt if error is KeyboardInterrupt else RunError):
        run(_tiny(**ONE_HEAD), out=out, quiet=True)
    partial = json.loads((out / "results.json").read_text())
    assert partial["status"] == ("interrupted" if error is KeyboardInterrupt else "failed")
    assert partial["error"]["stage"].startswith("after running probe"), partial["error"]
    assert "knn.k5.acc" in partial["taps"]["relu"]["metrics"] or "knn.k5.acc" in partial["taps"]["backbone"]["metrics"]
    monkeypatch.undo()
    resumed = run(_tiny(**ONE_HEAD), out=out, resume=True, quiet=True)
    assert resumed["status"] == "complete" and "relu" in resumed["buffer"]


def test_run_sweep_takes_keyword_overrides(tmp_path):
    recipe = _tiny(sweep={"backbone.pooling": ["cls", "mean"]})
    runs = run_sweep(recipe, out=tmp_path / "sw", quiet=True, probes__knn__ks=[3], data__limit__test=40)
    assert [r.path.name for r in runs] == ["pooling=cls", "pooling=mean"]
    for r in runs:
        assert r["recipe"]["probes"]["knn"]["ks"] == [3] and r["recipe"]["data"]["limit"]["test"] == 40
        assert "knn.k3.acc" in r.metrics()
    assert (tmp_path / "sw" / "compare.csv").is_file()


@pytest.mark.parametrize(("call", "message"), [
    (lambda: run(42), r"recipe_or_path takes a Recipe, a YAML file's path \(str or Path\) or a dict; got int 42\."),
    (lambda: run(None), "recipe_or_path takes a Recipe, .* got NoneType None."),
    (lambda: run({}, out=123), r"out takes a folder's path \(str or Path\) or None; got int 123."),
    (lambda: run({}, overrides="train.epochs=1"), r"got the string 'train.epochs=1': write overrides=\['train"),
    (lambda: run({}, overrides=["a=1", 2]), "overrides takes a list of 'KEY=VALUE' strings"),
    (lambda: run_sweep({}, overrides="x=1"), "overrides takes a list of 'KEY=VALUE' strings; got the string"),
])
def test_arguments_of_the_wrong_type_are_named_with_what_they_take(call, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match=message):
        call()
    assert not any(tmp_path.iterdir())  # refused before anything was written
