"""A run's trained heads leave headprobe: `load_heads` (torch modules) and `export_heads` (safetensors) give heads
that reproduce the run's own head-tap numbers on the backbone features."""

import json

import pytest
import torch
from report_run import results_dict

from headprobe import load_heads, load_heads_by_seed
from headprobe.cli import main
from headprobe.record.saved_heads import SavedHeadsError, export_heads
from headprobe.train.heads import ProjectionHead


def _fake_run(root, seeds=(0,)):
    """results.json of the synthetic run (heads mlp: 384→512→128 swish, BN; lin: one bias-free layer 384→256) and a
    last checkpoint per seed holding heads with random weights and BatchNorm statistics; returns those heads."""
    results = results_dict()
    results["recipe"]["seeds"] = list(seeds) if len(seeds) > 1 else None
    results["recipe"]["seed"] = seeds[0]
    results["heads"]["mlp"]["config"] |= {"bn_hidden": True, "bn_out": False, "l2_out": False}
    made = {}
    for seed in seeds:
        torch.manual_seed(seed)
        heads = {"mlp": ProjectionHead(384, kind="mlp", depth=2, width=512, out_dim=128, act="swish"),
                 "lin": ProjectionHead(384, kind="linear", depth=1, width=256)}
        heads["mlp"].train()(torch.randn(64, 384) * 3 + 1)  # moves the BatchNorm running statistics off 0/1
        folder = root / "checkpoints" / (f"seed-{seed}" if len(seeds) > 1 else "")
        folder.mkdir(parents=True, exist_ok=True)
        torch.save({"step": 3, "heads": {n: {"head": h.state_dict(), "predictor": None} for n, h in heads.items()}},
                   folder / "step-3.pt")
        torch.save({"step": 1, "heads": {}}, folder / "step-1.pt")  # an earlier checkpoint is not the one read
        made[seed] = {n: h.eval() for n, h in heads.items()}
    (root / "results.json").write_text(json.dumps(results))
    return made


def _same_outputs(a: dict, b: dict) -> None:
    x = torch.randn(32, 384)
    assert set(a) == set(b)
    with torch.no_grad():
        for name in a:
            for got, want in zip(a[name].taps(x), b[name].taps(x), strict=True):
                assert torch.equal(got, want), name


def test_load_heads_rebuilds_every_seed_from_its_last_checkpoint(tmp_path):
    made = _fake_run(tmp_path, seeds=(3, 7))
    loaded = load_heads_by_seed(tmp_path)
    assert list(loaded) == [3, 7]
    for seed in (3, 7):
        _same_outputs(loaded[seed], made[seed])
        assert not loaded[seed]["mlp"].training  # eval mode: BatchNorm uses the running statistics
    _same_outputs(load_heads(tmp_path), made[3])  # the default: the run's first seed
    _same_outputs(load_heads(tmp_path, seed=7), made[7])
    with pytest.raises(SavedHeadsError, match=r"no heads trained with seed 5; its seeds are \[3, 7\]"):
        load_heads(tmp_path, seed=5)


def test_exported_safetensors_rebuild_the_same_heads(tmp_path):
    made = _fake_run(tmp_path / "run", seeds=(0, 1))
    path = export_heads(tmp_path / "run")
    assert path == tmp_path / "run" / "heads.safetensors"
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        record = json.loads(f.metadata()["headprobe"])
        keys = set(f.keys())
    assert record["in_dim"] == 384 and record["seeds"] == [0, 1] and set(record["heads"]) == {"mlp", "lin"}
    assert "seed-1/mlp/layers.0.1.running_mean" in keys and "seed-0/lin/layers.0.0.weight" in keys
    for seed in (0, 1):
        _same_outputs(load_heads(path, seed=seed), made[seed])
    assert main(["export-heads", str(tmp_path / "run"), "--out", str(tmp_path / "elsewhere" / "h.safetensors")]) == 0
    _same_outputs(load_heads(tmp_path / "elsewhere" / "h.safetensors", seed=1), made[1])


def test_unreadable_runs_get_a_sentence(tmp_path, capsys):
    _fake_run(tmp_path / "run")
    for stale in (tmp_path / "run" / "checkpoints").glob("step-*.pt"):
        stale.unlink()
    with pytest.raises(SavedHeadsError, match="holds no checkpoint .* --resume"):
        load_heads(tmp_path / "run")
    assert main(["export-heads", str(tmp_path / "nowhere")]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    (tmp_path / "x.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(SavedHeadsError, match="not a readable safetensors file"):
        load_heads(tmp_path / "x.safetensors")
    results = results_dict()
    results["heads"] = {}
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "results.json").write_text(json.dumps(results))
    with pytest.raises(SavedHeadsError, match="has no trained heads"):
        load_heads(tmp_path / "bare")


@pytest.mark.slow
def test_loaded_heads_reproduce_the_runs_head_tap_numbers(tiny_recipe, tmp_path):
    from headprobe import extract, load_backbone, run
    from headprobe.data import load_data
    from headprobe.probes.knn import knn
    from headprobe.recipe import load_recipe

    recipe = {**tiny_recipe, "seeds": [0, 1], "augment": {"preset": "crop-flip", "views": 2},
              "heads": [{"name": "mlp", "type": "mlp", "depth": 2, "width": 16, "act": "swish"}],
              "train": {"epochs": 2, "batch_size": 64}, "probes": {"knn": {"ks": [5, 20]}}}
    results = run(recipe, out=tmp_path / "run", quiet=True)
    spec = load_recipe(recipe)
    backbone = load_backbone(spec.backbone.id, pooling=spec.backbone.pooling)
    data = load_data(spec.data)
    feats = {split: extract(backbone, getattr(data, split), data_info=data.info, split=split, batch_size=50)
             for split in ("train", "test")}
    assert all(f.cached for f in feats.values())  # the run's own features, from its cache
    for seed, heads in load_heads_by_seed(tmp_path / "run").items():
        with torch.no_grad():
            taps = {split: heads["mlp"].taps(f.features) for split, f in feats.items()}
        for depth, tap in ((1, "mlp@1"), (2, "mlp")):
            score = knn(taps["train"][depth - 1], feats["train"].labels, taps["test"][depth - 1],
                        feats["test"].labels, ks=[5, 20], num_classes=10)
            recorded = results["taps"][tap]["seeds"][str(seed)]["metrics"]
            assert score.metrics["knn.k5.acc"] == recorded["knn.k5.acc"], (seed, tap)
            assert score.metrics["knn.k20.acc"] == recorded["knn.k20.acc"], (seed, tap)
