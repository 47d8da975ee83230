"""Every offline recipe runs end to end in a reduced form (tiny backbone, few images, one epoch)."""

import json
from pathlib import Path

import pytest
import yaml

from headprobe.pipeline.compose import run, run_sweep
from headprobe.recipe.sweeps import sweep_size

pytestmark = pytest.mark.slow

RECIPES = sorted(p for p in (Path(__file__).parents[1] / "recipes").glob("*.yaml")
                 if p.name == "quickstart.yaml" or p.name.startswith("offline_"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_offline_recipe_runs_reduced(path, tiny_dinov2, tmp_path):
    recipe = yaml.safe_load(path.read_text())
    if recipe["data"]["source"].startswith("fashion-mnist") and not Path("/usr/share/datasets/fashion-mnist").exists():
        pytest.skip("needs Debian's files: apt-get install dataset-fashion-mnist")
    reductions = ["data.limit.train=64", "data.limit.test=32", "train.epochs=1", "train.batch_size=32",
                  "augment.views=2", "report=false"]
    # A recipe whose backbones are the tiny checkpoint files in tests/fixtures (the own-head table) keeps them:
    # they are already test-sized, and their own heads need their own backbone. Others get the tiny DINOv2.
    backbones = [b["id"] for b in recipe.get("sweep_zip", {}).get("backbone", [])] or [recipe["backbone"]["id"]]
    if not all(b.startswith("ssl:") and "tests/fixtures/" in b for b in backbones):
        reductions += [f"backbone.id=hf:{tiny_dinov2}", "backbone.resolution=null"]
    reductions += [f"heads.{i}.width=16" for i, head in enumerate(recipe.get("heads", []))
                   if head.get("type") != "pretrained"]
    if "orbits" in recipe.get("probes", {}):
        reductions.append("probes.orbits.n_images=4")
    if "knn" in recipe.get("probes", {}):
        reductions.append("probes.knn.ks=[5,10]")  # k must not exceed the 64 training images
    if "rotation" in recipe.get("probes", {}):
        reductions.append("probes.rotation.mlp_epochs=5")
    if "geometry" in recipe:
        reductions += ["geometry.rows=16", "geometry.track_rows=8", "geometry.track_max_iter=5",
                       "geometry.saddle_states=2"]
    if recipe.get("sweep") or recipe.get("sweep_zip"):
        results = run_sweep(path, out=tmp_path / "run", overrides=reductions, quiet=True)
        assert len(results) == sweep_size(recipe.get("sweep"), recipe.get("sweep_zip"))
        assert (tmp_path / "run" / "compare.csv").exists()
    else:
        results = [run(path, out=tmp_path / "run", overrides=reductions, quiet=True)]
    for result in results:
        data = json.loads((result.path / "results.json").read_text())
        assert data["status"] == "complete"
        assert set(data["taps"]) >= {"backbone"} | {h["name"] for h in recipe.get("heads", [])}
        # Every trained head trained; a null head (null_heads: init) is untrained by design, and a checkpoint's
        # own head (type: pretrained) is probed as it came.
        assert all(h["train"]["status"] == "complete" or h["config"].get("init_of") is not None
                   or h["config"].get("type") == "pretrained" for h in data["heads"].values())
        if "orbits" in recipe.get("probes", {}):  # the paper's class-centroid D_inter and the image-centroid one
            metrics = data["taps"]["backbone"]["metrics"]
            measured = [k.removesuffix(".orbit.d_ratio_image") for k in metrics if k.endswith(".orbit.d_ratio_image")]
            assert measured and all(f"{sweep}.orbit.d_ratio" in metrics for sweep in measured), sorted(metrics)
