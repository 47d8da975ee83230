"""`headprobe plan RECIPE` (headprobe/pipeline/plan.py): the cache bytes of a known configuration, exactly; the JSON
keys; a bad recipe refused in one line with exit code 2. That it imports no torch is checked in
tests/test_light_start.py, and its peak-RSS estimate against real runs in benchmarks/bench_plan_rss.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from timeouts import HANG_TIMEOUT_S

from headprobe.cli import main
from headprobe.pipeline.plan import (
    IMPORT_RSS_BYTES,
    LOAD_RSS_BYTES,
    N_VIEW_PARAMS,
    backbone_width,
    data_sizes,
    make_plan,
)
from headprobe.recipe import load_recipe

ROOT = Path(__file__).resolve().parent.parent


def _recipe(**extra) -> dict:
    return {"name": "tiny", "backbone": {"id": "offline:dinov2-vits14", "resolution": 56},
            "data": {"source": "sklearn-digits", "limit": {"train": 100, "test": 50}},
            "probes": {"linear": {}}, **extra}


def test_the_view_parameters_counted_are_the_augmentations():
    from headprobe.data.augment import PARAM_NAMES

    assert N_VIEW_PARAMS == len(PARAM_NAMES)


@pytest.mark.parametrize("dtype, size", [("float32", 4), ("float16", 2), ("bfloat16", 2)])
def test_cache_bytes_of_clean_features_follow_the_store_dtype(dtype, size):
    plan = make_plan(load_recipe(_recipe(features={"store_dtype": dtype})))
    # train and test features in the store dtype, each with its int64 labels
    assert plan.taps[0].disk_bytes == 100 * 384 * size + 100 * 8 + 50 * 384 * size + 50 * 8
    assert plan.taps[0].memory_bytes == 150 * 384 * 4 + 150 * 8  # computed in float32 whatever is stored
    assert [t.name for t in plan.taps] == ["backbone"] and plan.totals["images_extracted"] == 150


def test_views_rotations_and_head_taps_are_counted():
    heads = [{"name": "h", "type": "mlp", "depth": 2, "width": 64, "out_dim": 32}]
    recipe = _recipe(heads=heads, seeds=[0, 1], augment={"views": 3}, null_heads=["init"], train={"batch_size": 50},
                     probes={"linear": {}, "rotation": {}, "invariance": {}}, features={"store_dtype": "float16"})
    plan = make_plan(load_recipe(recipe))
    rows = plan.taps[0].rows
    # training views for the heads and held-out views of the test images for the view probes; 4 rotations each
    assert rows == {"train": 100, "test": 50, "views": 100 * 3 + 50 * 3, "rotated": 4 * 150}
    clean = 150 * (384 * 2 + 8)
    assert plan.taps[0].disk_bytes == clean + 3 * clean + 450 * (384 * 2 + N_VIEW_PARAMS * 4)
    assert [(t.name, t.seed, t.dim) for t in plan.taps[1:]] == [
        (name, seed, dim) for seed in (0, 1) for name, dim in
        (("h@1", 64), ("h", 32), ("h.init@1", 64), ("h.init", 32))]
    assert plan.taps[1].memory_bytes == (150 + 450 + 600) * 64 * 4
    terms = plan.rss["terms"]
    assert terms["imports"] == IMPORT_RSS_BYTES and terms["backbone"] == LOAD_RSS_BYTES["offline:dinov2-vits14"]
    assert plan.rss["peak_bytes"] == sum(terms.values())


def test_widths_and_sizes_say_what_they_cannot_know(tmp_path):
    recipe = load_recipe(_recipe(backbone={"id": "offline:dinov2-vits14", "pooling": "cls+mean", "layers": [-4, -1]}))
    assert backbone_width(recipe.backbone) == (4 * 384, "declared in the registry")
    folder = tmp_path / "vit"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"hidden_size": 768}))
    hf = load_recipe(_recipe(backbone={"id": f"hf:{folder}"}))
    assert backbone_width(hf.backbone) == (768, "config.json hidden_size")
    timm = make_plan(load_recipe(_recipe(backbone={"id": "timm:vit_small_patch16_224/random"})))
    assert timm.backbone["dim"] is None and "read from the weights" in timm.backbone["dim_source"]
    assert timm.taps[0].disk_bytes is None and timm.rss["peak_bytes"] is None
    assert "backbone" in timm.rss["why_unknown"]
    full = load_recipe({"name": "x", "data": {"source": "fashion-mnist"}})
    assert data_sizes(full.data)[:2] == (60000, 10000)
    digits = load_recipe({"name": "x", "data": {"source": "sklearn-digits", "test_fraction": 0.25}})
    assert data_sizes(digits.data)[:2] == (1347, 450)  # what load_data's stratified split makes


def test_json_output_has_the_plan_keys(capsys):
    assert main(["plan", "recipes/quickstart.yaml", "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert set(plan) == {"recipe", "backbone", "data", "taps", "totals", "peak_rss", "time", "notes"}
    assert set(plan["taps"][0]) == {"name", "seed", "dim", "rows", "disk_bytes", "memory_bytes"}
    assert set(plan["peak_rss"]) == {"terms", "peak_bytes", "why_unknown"}
    assert plan["data"]["n_train"] == 1347 and plan["backbone"]["dim"] == 384
    assert len(plan["taps"]) == 1 + 3 * 8  # backbone + 3 seeds x (2 heads + 2 init copies) x 2 layers
    assert plan["time"]["extract_s"] > 0


def test_the_table_names_the_totals(capsys):
    assert main(["plan", "recipes/quickstart.yaml", "--set", "features.store_dtype=float16"]) == 0
    out = capsys.readouterr().out
    assert "expected peak RSS" in out and "feature cache" in out and "lin_bn.init@1" in out


def test_a_bad_recipe_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_recipe(features={"store_dtype": "int8"})))
    done = subprocess.run([sys.executable, "-m", "headprobe", "plan", str(bad)], capture_output=True, text=True,
                          cwd=ROOT, timeout=HANG_TIMEOUT_S)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "store_dtype" in lines[0], done.stderr
