"""Several seeds: heads retrained per seed on the same features, metrics averaged, intervals over seeds kept."""

import dataclasses
import importlib
import json

import pytest
from conftest import tiny_recipe_of

from headprobe import run
from headprobe.pipeline.compose import RunError

SEEDS_RECIPE = {
    "heads": [{"name": "relu", "act": "relu", "width": 16, "out_dim": 8}, {"name": "ident", "type": "identity"}],
    "objective": {"name": "vicreg"},
    "augment": {"preset": "crop-flip", "views": 2},
    "train": {"epochs": 2, "batch_size": 50, "log_every": 2},
    "probes": {"linear": {"C_grid": [0.1, 1.0]}, "knn": {"ks": [5]}, "invariance": {}, "spectrum": {}},
    "report": False,
}


@pytest.fixture(scope="module")
def two_seeds(tiny_dinov2, tmp_path_factory):
    """The run with seeds [0, 1] that both tests below read: run once, with a cache of its own."""
    root = tmp_path_factory.mktemp("two-seeds")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HEADPROBE_CACHE", str(root / "cache"))
        return run({**tiny_recipe_of(tiny_dinov2), **SEEDS_RECIPE, "seeds": [0, 1]}, out=root / "s", quiet=True)


@pytest.mark.slow
def test_each_seed_equals_its_own_single_seed_run_and_the_tap_is_their_mean(tiny_recipe, tmp_path, two_seeds):
    recipe, several = {**tiny_recipe, **SEEDS_RECIPE}, two_seeds
    tap = several["taps"]["relu"]
    assert set(tap["seeds"]) == {"0", "1"}
    # Seed 0 of the multi-seed run trains and scores its heads exactly as the single-seed run (seed 0) does.
    seed0 = run({**recipe}, out=tmp_path / "zero", quiet=True)
    assert tap["seeds"]["0"]["metrics"] == seed0["taps"]["relu"]["metrics"]
    assert tap["seeds"]["1"]["metrics"] != tap["seeds"]["0"]["metrics"]  # another init and batch order
    for metric, value in tap["metrics"].items():
        per_seed = [tap["seeds"][s]["metrics"][metric] for s in ("0", "1")]
        assert value == pytest.approx(sum(per_seed) / 2, rel=1e-12)
        unc = tap["uncertainty"][metric]
        assert unc["per_seed"] == per_seed and unc["n_seeds"] == 2
        assert unc["ci95"] is None or unc["ci95"][0] <= value <= unc["ci95"][1]
    assert tap["uncertainty"]["alpha_req"]["method"] == "t interval over 2 seeds"  # no per-unit values: seeds
    assert "bootstrap" in tap["uncertainty"]["linear.acc"]["method"]
    # A ratio recomputed per resample (not a mean over images): each seed's ratio on the same resamples, averaged.
    assert "mean over 2 seeds" in tap["uncertainty"]["view_spread_rel"]["method"]
    evidence = several["buffer"]["relu"]["evidence"]["view_spread_rel"]
    assert evidence["method"] == "paired bootstrap over images with views"
    # The backbone and the identity head are not retrained: one value, no seeds.
    assert "seeds" not in several["taps"]["backbone"] and "seeds" not in several["taps"]["ident"]
    assert several["taps"]["backbone"]["metrics"] == seed0["taps"]["backbone"]["metrics"]
    assert several["protocol"]["seeds"]["seeds"] == [0, 1]
    assert set(several["heads"]["relu"]["train_seeds"]) == {"0", "1"}
    ckpt = several.path / "checkpoints"
    assert (ckpt / "seed-0").is_dir() and (ckpt / "seed-1").is_dir()
    lines = [json.loads(x) for x in (several.path / "metrics.jsonl").read_text().splitlines()]
    assert {line.get("seed") for line in lines if line.get("stage") == "train"} == {0, 1}
    # The conclusions: the identity head is the backbone (every margin 0: inconclusive; Q-class equivalent with a
    # zero-width interval). The ReLU head's 8-d output of the 32-d features loses class information at both seeds
    # (linear, k-NN and label MI resolved for, ~25 points of accuracy) and nothing is resolved against: buffer.
    ident, relu = several["buffer"]["ident"], several["buffer"]["relu"]
    assert (ident["verdict"], ident["support"], ident["against"]) == ("inconclusive", 0, 0)
    assert all(entry["margin"] == 0 for entry in ident["evidence"].values())
    assert several["claims"]["Q-class"]["heads"]["ident"]["answer"] == "equivalent"
    assert (relu["verdict"], relu["against"]) == ("buffer", 0)
    assert {m for m, e in relu["evidence"].items() if e["resolved"] == "for"} == {"linear.acc", "knn.k5.acc",
                                                                                  "mi.label"}


@pytest.mark.slow
def test_a_multi_seed_run_resumes_per_seed(tiny_recipe, tmp_path, monkeypatch, two_seeds):
    recipe, reference = {**tiny_recipe, **SEEDS_RECIPE, "seeds": [0, 1]}, two_seeds
    module = importlib.import_module("headprobe.probes.builtin.knn")
    original, calls = module.KNN, []

    def knn_failing_on_the_second_seed(tap, **options):
        calls.append(tap.name)
        if tap.name == "relu" and calls.count("relu") == 2:
            raise FloatingPointError("simulated failure")
        return original(tap, **options)

    monkeypatch.setattr(module, "KNN", dataclasses.replace(original, function=knn_failing_on_the_second_seed))
    with pytest.raises(RunError, match=r"seed 1.*simulated failure"):
        run(recipe, out=tmp_path / "r", quiet=True)
    partial = json.loads((tmp_path / "r" / "results.json").read_text())
    assert "knn" in partial["taps"]["relu"]["seeds"]["0"]["protocol"]
    assert "knn" not in partial["taps"]["relu"]["seeds"]["1"]["protocol"]
    monkeypatch.undo()
    resumed = run(recipe, out=tmp_path / "r", resume=True, quiet=True)
    for name, tap in reference["taps"].items():
        assert resumed["taps"][name]["metrics"] == tap["metrics"], name
        assert resumed["taps"][name]["uncertainty"] == tap["uncertainty"], name
    assert resumed["buffer"] == reference["buffer"]


def test_seeds_are_checked_before_anything_runs(tiny_recipe, tmp_path):
    from headprobe.recipe import RecipeError

    for bad, match in (([], "empty"), ([0, 0], "repeats"), ([-1], "seeds\\[0\\]")):
        with pytest.raises(RecipeError, match=match):
            run({**tiny_recipe, **SEEDS_RECIPE, "seeds": bad}, out=tmp_path / "x", quiet=True)
    assert not (tmp_path / "x").exists()
