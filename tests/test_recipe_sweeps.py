"""Sweeps: readable labels (derived or given), zipped keys next to the cartesian ones, nested keys, and the backbone
probed once where it is the same across a sweep."""

import json

import pytest

from headprobe.cli import main
from headprobe.recipe import RecipeError, expand_sweep, load_recipe

HEADS = {"heads": [{"name": "h", "type": "mlp"}]}


def _labels(recipe: dict) -> list[str]:
    return [label for label, _ in expand_sweep(recipe)]


def test_a_swept_block_is_named_by_the_leaves_that_differ():
    blocks = [{"id": "offline:dinov2-vits14", "pooling": "cls", "resolution": 56},
              {"id": "scratch:vit-tiny", "pooling": "cls", "resolution": 56}]
    assert _labels({"sweep": {"backbone": blocks}}) == ["backbone.id=offline:dinov2-vits14",
                                                        "backbone.id=scratch:vit-tiny"]
    heads = [[{"name": "h", "act": "relu", "depth": 2}], [{"name": "h", "act": "gelu", "depth": 3}]]
    assert _labels({"sweep": {"heads": heads}}) == ["heads.0.act=relu,heads.0.depth=2",
                                                    "heads.0.act=gelu,heads.0.depth=3"]
    same = [{"id": "scratch:vit-tiny"}, {"id": "scratch:vit-tiny"}]
    assert _labels({"sweep": {"backbone": same}}) == ["backbone=0", "backbone=1"]  # nothing differs: numbered


def test_nested_keys_and_set_overrides_sweep_a_dotted_key():
    ids = ["offline:dinov2-vits14", "scratch:vit-tiny"]
    for recipe, overrides in (({"sweep": {"backbone": {"id": ids}}}, None),
                              ({}, [f"sweep.backbone.id=[{ids[0]}, {ids[1]}]"])):
        combos = expand_sweep(recipe, overrides)
        assert [label for label, _ in combos] == ["id=offline:dinov2-vits14", "id=scratch:vit-tiny"]
        assert [load_recipe(recipe, items).backbone.id for _, items in combos] == ids
        assert all(load_recipe(recipe, items).sweep == {} for _, items in combos)  # each run is a plain run


def test_zipped_keys_go_together_and_combine_with_the_grid():
    recipe = {**HEADS, "sweep_zip": {"heads.0.act": ["relu", "swish"], "heads.0.depth": [1, 3]},
              "sweep": {"seed": [0, 1]}}
    combos = expand_sweep(recipe)
    assert [label for label, _ in combos] == ["act=relu-depth=1-seed=0", "act=relu-depth=1-seed=1",
                                              "act=swish-depth=3-seed=0", "act=swish-depth=3-seed=1"]
    made = [load_recipe(recipe, items) for _, items in combos]
    assert [(r.heads[0].act, r.heads[0].depth, r.seed) for r in made] == [
        ("relu", 1, 0), ("relu", 1, 1), ("swish", 3, 0), ("swish", 3, 1)]
    assert [label for label, _ in expand_sweep({**HEADS, "sweep_zip": {"heads.0.act": ["relu", "swish"]}})] == [
        "act=relu", "act=swish"]


def test_given_labels_name_the_runs():
    recipe = {**HEADS, "sweep": {"heads.0.act": ["relu", "swish"]}, "sweep_labels": ["plain", "smooth"]}
    assert _labels(recipe) == ["plain", "smooth"]


@pytest.mark.parametrize("recipe, message", [
    ({**HEADS, "sweep_zip": {"heads.0.act": ["relu", "swish"], "heads.0.depth": [1]}},
     r"lists must be equally long; they have heads\.0\.act: 2, heads\.0\.depth: 1"),
    ({**HEADS, "sweep": {"heads.0.act": ["relu"]}, "sweep_zip": {"heads.0.act": ["swish"]}},
     "heads.0.act is in both sweep and sweep_zip"),
    ({**HEADS, "sweep": {"heads.0.act": ["relu", "swish"]}, "sweep_labels": ["one"]},
     "sweep_labels has 1 names for 2 runs; give one per run, in the order act=relu, act=swish"),
    ({**HEADS, "sweep": {"heads.0.act": ["relu", "swish"]}, "sweep_labels": ["a", "a"]}, "must be distinct"),
    ({**HEADS, "sweep_labels": ["a"]}, "has no sweep or sweep_zip"),
    ({**HEADS, "sweep": {"backbone": {"id": "scratch:vit-tiny"}}}, r"sweep\.backbone\.id must be a non-empty list"),
    ({**HEADS, "sweep_zip": {"heads.0.act": ["relu", "bogus"]}}, "sweep combination act=bogus: heads"),
])
def test_bad_sweeps_are_refused_with_a_sentence(recipe, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe(recipe)


def test_validate_counts_the_runs(tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_text(json.dumps({**HEADS, "sweep_zip": {"heads.0.act": ["relu", "swish"]},
                                "sweep": {"seed": [0, 1, 2]}}))
    assert main(["validate", str(path)]) == 0
    assert "sweep: 6 runs" in capsys.readouterr().out


@pytest.mark.parametrize("sweep", [{"sweep": {"heads.0.act": ["relu", "swish"]}},
                                   {"sweep_zip": {"heads.0.act": ["relu", "swish"]}}])
def test_run_of_a_sweep_recipe_says_to_use_run_sweep(tiny_recipe, tmp_path, sweep):
    """run() of a sweep recipe ran its base recipe alone and returned as if that were the sweep."""
    from headprobe import run

    with pytest.raises(RecipeError, match=r"is a sweep of 2 runs; run_sweep"):
        run({**tiny_recipe, **HEADS, **sweep, "train": {"epochs": 1, "batch_size": 64}}, out=tmp_path / "r", quiet=True)
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_the_backbone_is_probed_once_where_it_is_the_same(tiny_recipe, tmp_path):
    from headprobe import run
    from headprobe.pipeline import run_sweep

    recipe = {**tiny_recipe, "augment": {"preset": "crop-flip", "views": 2},
              "heads": [{"name": "h", "type": "mlp", "width": 16}], "train": {"epochs": 1, "batch_size": 64},
              "probes": {"linear": {"C_grid": [0.1, 1.0]}, "knn": {"ks": [5]}, "invariance": {}},
              "sweep": {"backbone.pooling": ["cls", "mean"], "heads.0.act": ["relu", "swish"]}}
    runs = {r.path.name: r for r in run_sweep(recipe, out=tmp_path / "sw", quiet=True)}
    assert list(runs) == ["pooling=cls-act=relu", "pooling=cls-act=swish", "pooling=mean-act=relu",
                          "pooling=mean-act=swish"]
    for first, second in (("pooling=cls-act=relu", "pooling=cls-act=swish"),
                          ("pooling=mean-act=relu", "pooling=mean-act=swish")):
        taken, source = runs[second]["taps"]["backbone"], runs[first]["taps"]["backbone"]
        assert taken["reused_from"] == f"../{first}" and "reused_from" not in source
        assert taken["metrics"] == source["metrics"] and taken["uncertainty"] == source["uncertainty"]
        lines = (tmp_path / "sw" / second / "metrics.jsonl").read_text().splitlines()
        probed = {json.loads(line).get("tap") for line in lines if '"stage": "probe"' in line}
        assert "backbone" not in probed and "h" in probed  # the backbone's probes did not run again
        assert runs[second]["buffer"]["h"]["evidence"]  # the verdict is paired with the taken per-image values
    assert runs["pooling=mean-act=relu"]["taps"]["backbone"]["metrics"] != runs["pooling=cls-act=relu"]["taps"][
        "backbone"]["metrics"]  # another pooling: probed on its own
    alone = run({**recipe, "sweep": {}, "heads": [{"name": "h", "type": "mlp", "width": 16, "act": "swish"}]},
                out=tmp_path / "alone", quiet=True)
    reused = runs["pooling=cls-act=swish"]
    assert alone["taps"]["backbone"]["metrics"] == reused["taps"]["backbone"]["metrics"]
    assert alone["taps"]["backbone"]["uncertainty"] == reused["taps"]["backbone"]["uncertainty"]
    assert alone["buffer"] == reused["buffer"]  # the same verdicts as probing the backbone again


SWEEP_SCRIPT = """
import json, sys
from headprobe.pipeline import run_sweep
run_sweep(json.loads(sys.argv[1]), out=sys.argv[2], quiet=True)
"""


@pytest.mark.slow
@pytest.mark.distributed
def test_two_processes_take_the_backbone_tap_alike(tiny_recipe, tmp_path):
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    torchrun = Path(sys.executable).parent / "torchrun"
    if shutil.which("torchrun", path=str(torchrun.parent)) is None:
        pytest.skip("torchrun missing")
    script = tmp_path / "job.py"
    script.write_text(SWEEP_SCRIPT)
    recipe = {**tiny_recipe, "augment": {"preset": "crop-flip", "views": 2},
              "heads": [{"name": "h", "type": "mlp", "width": 16}], "train": {"epochs": 1, "batch_size": 64},
              "probes": {"linear": {"C_grid": [0.1, 1.0]}, "knn": {"ks": [5]}},
              "sweep": {"heads.0.act": ["relu", "swish"]}}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run([str(torchrun), "--nproc_per_node", "2", str(script), json.dumps(recipe),
                           str(tmp_path / "sw")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = (json.loads((tmp_path / "sw" / f"act={a}" / "results.json").read_text()) for a in ("relu", "swish"))
    assert second["environment"]["num_processes"] == 2
    assert second["taps"]["backbone"]["reused_from"] == "../act=relu"
    assert second["taps"]["backbone"]["metrics"] == first["taps"]["backbone"]["metrics"]
    assert second["taps"]["backbone"]["uncertainty"] == first["taps"]["backbone"]["uncertainty"]
    assert second["buffer"]["h"]["evidence"]
