"""The tuned path: backbone and heads trained together on views made on the fly (tiny DINOv2, 40 digits)."""

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file
from timeouts import HANG_TIMEOUT_S

import headprobe.train.tuned as tuned_module
from headprobe import run
from headprobe.backbones import apply_tuning, load_backbone
from headprobe.data import load_data
from headprobe.data.augment import augment_spec
from headprobe.features.views import extract_views
from headprobe.recipe import DataSpec, HeadSpec, LimitSpec, TrainSpec
from headprobe.train.cached_views import batch_for_step
from headprobe.train.tuned import StepViews, save_tuned_backbone, train_tuned, trainable_state

AUGMENT = augment_spec("crop-flip")
HEADS = [HeadSpec(name="lin", type="linear", width=16), HeadSpec(name="relu", act="relu", width=16, out_dim=8)]
TRAIN = TrainSpec(steps=2, batch_size=20, lr=1e-2, log_every=1)


@pytest.fixture
def digits():
    return load_data(DataSpec(source="sklearn-digits", limit=LimitSpec(train=40, test=40)))


def _tuned(tiny_dinov2: str, policy: str, **options):
    backbone = load_backbone(f"hf:{tiny_dinov2}")
    apply_tuning(backbone, policy, **options)
    return backbone


def _train(backbone, digits, heads=HEADS, train=TRAIN, **kw):
    return train_tuned(backbone, heads, digits.train, augment=AUGMENT, views=2, objective_name="vicreg",
                       objective_options={}, train=train, seed=0, **kw)


def _weights(backbone) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in backbone.model.named_parameters()}


def _moved(backbone, before) -> set[str]:
    return {n for n, p in backbone.model.named_parameters() if not torch.equal(p, before[n])}


def test_view_pixels_are_the_cached_paths(tiny_dinov2, digits):
    backbone = load_backbone(f"hf:{tiny_dinov2}")
    seen = []
    hook = backbone.register_forward_pre_hook(lambda module, args: seen.append(args[0].clone()))
    extract_views(backbone, digits.train, data_info=digits.info, augment=AUGMENT, views=2, seed=0, batch_size=80,
                  cache=False)
    hook.remove()
    cached = torch.cat(seen)  # row 2·i + k: view k of image i
    steps = StepViews(digits.train, augment=AUGMENT, preprocess=backbone.preprocess, views=2, batch_size=20, seed=0)
    for step in (0, 3):
        idx, v1, v2 = batch_for_step(step, 40, 2, 20, 0)
        x1, x2 = steps[step]
        assert torch.equal(x1, cached[2 * idx + v1]) and torch.equal(x2, cached[2 * idx + v2])
    shard = StepViews(digits.train, augment=AUGMENT, preprocess=backbone.preprocess, views=2, batch_size=20, seed=0,
                      rank=1, world=3)[3][0]
    assert torch.equal(shard, x1[1::3][:6])  # rank 1 of 3: rows 1, 4, ..., 16 of the 20; 20 % 3 rows dropped


def test_last_block_trains_with_the_heads_and_nothing_else_moves(tiny_dinov2, digits, tmp_path):
    backbone = _tuned(tiny_dinov2, "last:1")
    before, records = _weights(backbone), []
    states, summary = _train(backbone, digits, log=records.append, checkpoint_dir=tmp_path)
    tuned = {n for n in before if n.startswith(("encoder.layer.1.", "layernorm."))}
    assert {n for n, p in backbone.model.named_parameters() if p.requires_grad} == tuned
    assert _moved(backbone, before) == tuned  # every tuned weight moved; every other one is bit-identical
    assert summary["optimizer_groups"] == ["backbone", "lin", "relu"] and summary["stopped_at"] is None
    assert [(r["head"], r["step"]) for r in records] == [("lin", 1), ("relu", 1), ("lin", 2), ("relu", 2)]
    for step in (1, 2):
        rows = [r for r in records if r["step"] == step]
        assert rows[0]["total_loss"] == pytest.approx(sum(r["loss"] for r in rows), rel=1e-6)
        assert {"vicreg.sim", "out_std", "rankme", "grad_norm", "backbone.grad_norm", "backbone.rel_update"} <= set(
            rows[0])
    for state in states.values():
        assert state.status == "complete" and not state.head.training
        assert next(state.head.parameters()).device.type == "cpu"
    saved = torch.load(tmp_path / "step-2.pt", weights_only=False)
    assert set(saved["backbone"]) == tuned and saved["step"] == 2 and set(saved["heads"]) == {"lin", "relu"}
    assert [g["name"] for g in saved["optimisers"]["joint"]["optimizer"]["param_groups"]] == ["backbone", "lin", "relu"]
    path = save_tuned_backbone(backbone, tmp_path / "out")
    assert set(load_file(path)) == tuned


def test_lora_moves_only_the_adapters(tiny_dinov2, digits, tmp_path):
    backbone = _tuned(tiny_dinov2, "lora", r=4, alpha=8)
    before = _weights(backbone)
    _train(backbone, digits, heads=HEADS[:1])
    adapters = {n for n in before if ".lora_A." in n or ".lora_B." in n}
    moved = _moved(backbone, before)
    assert {n for n in adapters if ".lora_B." in n} <= moved <= adapters
    assert (save_tuned_backbone(backbone, tmp_path) / "adapter_config.json").exists()


def test_a_nan_loss_stops_training_and_keeps_the_last_good_state(tiny_dinov2, digits, monkeypatch, tmp_path):
    real, calls = tuned_module.objective_loss, {"relu": 0}

    def poisoned(objective, options, state, z1, z2, *, gather_distributed):
        terms, h1 = real(objective, options, state, z1, z2, gather_distributed=gather_distributed)
        if state.name == "relu":
            calls["relu"] += 1
            if calls["relu"] >= 3:
                terms.loss = terms.loss * float("nan")
        return terms, h1

    monkeypatch.setattr(tuned_module, "objective_loss", poisoned)
    backbone = _tuned(tiny_dinov2, "last:1")
    train = dataclasses.replace(TRAIN, steps=4, checkpoint_every=2)
    states, summary = _train(backbone, digits, train=train, checkpoint_dir=tmp_path)
    assert summary["stopped_at"] == 3
    for state in states.values():  # the healthy head stops too: it shares the backbone
        assert state.status == "stopped" and "became nan at step 3" in state.message and "from step 2" in state.message
    at_two = torch.load(tmp_path / "step-2.pt", weights_only=False)
    for name, value in trainable_state(backbone).items():
        assert torch.equal(value, at_two["backbone"][name]), name
    assert torch.equal(states["lin"].head.state_dict()["layers.0.0.weight"],
                       at_two["heads"]["lin"]["head"]["layers.0.0.weight"])
    assert {p.name for p in tmp_path.iterdir()} == {"step-2.pt", "step-3.pt"}


def test_tracking_records_its_time_and_the_collapse_start_as_on_the_cached_path(tiny_dinov2, digits):
    from headprobe.recipe import GeometrySpec

    records = []
    track = GeometrySpec(track_every=1, track_rows=4, track_max_iter=8, collapse_offset=1.0)
    _, summary = _train(_tuned(tiny_dinov2, "last:1"), digits, heads=HEADS[:1], log=records.append, track=track)
    start = summary["collapse_start"]["lin"]
    assert start["collapsed"] and start["n_samples"] == 20 and start["init"].startswith("collapsed_init")
    geometry = [r for r in records if r["stage"] == "geometry"]
    assert [r["step"] for r in geometry] == [1, 2] and geometry[0]["out_std"] <= start["threshold"]
    assert summary["track_s"] == pytest.approx(sum(r["time_s"] for r in geometry)) and summary["track_s"] > 0


def test_resume_continues_exactly(tiny_dinov2, digits, tmp_path):
    train = dataclasses.replace(TRAIN, steps=4, checkpoint_every=2)
    full = _tuned(tiny_dinov2, "last:1")
    full_states, _ = _train(full, digits, heads=HEADS[:1], train=train, checkpoint_dir=tmp_path)
    resumed = _tuned(tiny_dinov2, "last:1")
    states, summary = _train(resumed, digits, heads=HEADS[:1], train=train, resume_from=tmp_path / "step-2.pt")
    assert summary["start_step"] == 2
    expected = trainable_state(full)
    for name, value in trainable_state(resumed).items():
        assert torch.equal(value, expected[name]), name
    for key, value in full_states["lin"].head.state_dict().items():
        assert torch.equal(states["lin"].head.state_dict()[key], value), key


@pytest.mark.slow
def test_pipeline_scores_the_tuned_backbone_and_keeps_the_untuned_one(tiny_recipe, tiny_dinov2, tmp_path):
    recipe = {**tiny_recipe, "data": {"source": "sklearn-digits", "limit": {"train": 40, "test": 40}},
              "backbone": {**tiny_recipe["backbone"], "tune": "last:1"},
              "probes": {"knn": {"ks": [5]}, "spectrum": {}},
              "heads": [{"name": "lin", "type": "linear", "width": 16}, {"name": "ident", "type": "identity"}],
              "objective": {"name": "vicreg"}, "augment": {"preset": "crop-flip", "views": 2},
              "train": {"steps": 2, "batch_size": 20, "lr": 1e-2, "log_every": 1}}
    a = run(recipe, out=tmp_path / "a", quiet=True)
    taps = a["taps"]
    assert list(taps) == ["backbone_untuned", "backbone", "lin@1", "lin", "ident"]
    assert taps["backbone_untuned"]["metrics"]["rankme"] != taps["backbone"]["metrics"]["rankme"]
    assert taps["ident"]["metrics"] == taps["backbone"]["metrics"]  # the identity head is the tuned backbone
    tuned = a["backbone_tuned"]
    block = load_backbone(f"hf:{tiny_dinov2}")
    expected = sum(p.numel() for m in (block.blocks[-1], *block.norm) for p in m.parameters())
    assert tuned["trainable"] == tuned["tuning"]["trainable"] == expected and tuned["tuning"]["policy"] == "last:1"
    assert tuned["fingerprint"] != a["backbone"]["fingerprint"] == tuned["tuning"]["base_fingerprint"]
    assert tuned["saved"] == "checkpoints/backbone.safetensors"
    assert {p.name for p in (tmp_path / "a" / "checkpoints").iterdir()} == {"step-2.pt", "backbone.safetensors"}
    assert a["heads"]["ident"]["train"]["status"] == a["heads"]["lin"]["train"]["status"] == "complete"
    assert a["protocol"]["train"]["tuning"]["policy"] == "last:1"
    lines = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert {(x["head"], x["step"]) for x in lines if x["stage"] == "train"} == {
        (h, s) for h in ("lin", "ident") for s in (1, 2)}
    b = run(recipe, out=tmp_path / "b", quiet=True)  # same seed, same numbers
    assert b["backbone_tuned"]["fingerprint"] == tuned["fingerprint"]
    assert {t: v["metrics"] for t, v in b["taps"].items()} == {t: v["metrics"] for t, v in taps.items()}
    assert b["protocol"]["features"]["cache"]["train"]["hit"]  # the tuned weights are bit-identical


TWO_PROCESSES = """
import json, sys
from headprobe import run
run(json.loads(sys.argv[1]), out=sys.argv[2], quiet=True)
"""


@pytest.mark.slow
@pytest.mark.distributed
def test_two_processes_train_like_one(tiny_recipe, tmp_path):
    """Each rank takes half of every batch and the objective gathers: SGD reaches the one-process weights (Adam's
    first steps, ≈ lr·sign(g), would magnify float noise in near-zero gradients)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("torchrun missing")
    recipe = {**tiny_recipe, "data": {"source": "sklearn-digits", "limit": {"train": 41, "test": 20}},
              "backbone": {**tiny_recipe["backbone"], "tune": "last:1"}, "probes": {"knn": {"ks": [5]}},
              "heads": [{"name": "lin", "type": "linear", "width": 16}], "augment": {"preset": "crop-flip", "views": 2},
              "train": {"steps": 2, "batch_size": 20, "optimizer": "sgd", "lr": 0.05, "log_every": 1}}
    one = run(recipe, out=tmp_path / "one", quiet=True)
    script = tmp_path / "job.py"
    script.write_text(TWO_PROCESSES)
    env = {**os.environ, "HEADPROBE_CACHE": str(tmp_path / "cache-two"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(torchrun), "--nproc_per_node", "2", str(script), json.dumps(recipe),
                           str(tmp_path / "two")], env=env, capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    two = json.loads((tmp_path / "two" / "results.json").read_text())
    assert two["environment"]["num_processes"] == 2 and two["protocol"]["train"]["batch_per_process"] == 10
    a, b = (load_file(p / "checkpoints" / "backbone.safetensors") for p in (one.path, tmp_path / "two"))
    for name, value in a.items():
        torch.testing.assert_close(b[name], value, rtol=0, atol=1e-5)
    losses = {}
    for name in ("one", "two"):
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        losses[name] = [x["loss"] for x in map(json.loads, lines) if x["stage"] == "train"]
    assert losses["two"] == pytest.approx(losses["one"], rel=1e-5) and len(losses["one"]) == 2
