"""Taps compared across runs: paired on the same test images, a two-level bootstrap over seeds and images."""

import json
from pathlib import Path

import pytest
import torch

from headprobe.stats.bootstrap import PerUnit, SpreadRatio, save_per_unit
from headprobe.stats.cross_run import (
    answer_lines,
    arm_label,
    compare_arms,
    compare_sweep,
    cross_run_difference,
    group_runs,
)

DATA = {"source": "fashion-mnist", "fingerprint": "f", "limit": {"train": 10, "test": 6}, "split_seed": 0, "n_test": 6}
IDENTITY = [{"name": "head", "type": "identity"}]
MLP2 = [{"name": "head", "type": "mlp", "depth": 2, "act": "relu", "bn_hidden": True}]


def fake_run(root: Path, name: str, heads: list, seed: int, tap_values: dict, data: dict = DATA) -> Path:
    path = root / name
    (path / "per_unit").mkdir(parents=True)
    results = {"status": "complete", "recipe": {"seed": seed, "heads": heads}, "data": data,
               "protocol": {"views_probed": {"split": "test", "n_images": 6, "views": 2, "seed": 100 + seed}}}
    (path / "results.json").write_text(json.dumps(results))
    for tap, stats in tap_values.items():
        save_per_unit(path / "per_unit" / f"{tap}.safetensors", stats)
    return path


def acc(values) -> PerUnit:
    return PerUnit(torch.tensor(values, dtype=torch.float64), "test images")


def test_arms_are_named_by_their_heads_and_keyed_by_seed(tmp_path):
    a = fake_run(tmp_path, "a", IDENTITY, 0, {"backbone": {"linear.acc": acc([1.0] * 6)}})
    b = fake_run(tmp_path, "b", MLP2, 0, {"backbone": {"linear.acc": acc([1.0] * 6)}})
    assert arm_label({"recipe": {"heads": IDENTITY}}) == "no head"
    assert arm_label({"recipe": {"heads": [{"type": "linear", "depth": 2}]}}) == "linear d2"
    assert group_runs([a, b]) == {"no head": {0: a}, "mlp d2 relu bn": {0: b}}
    twin = fake_run(tmp_path, "c", IDENTITY, 0, {"backbone": {"linear.acc": acc([1.0] * 6)}})
    with pytest.raises(ValueError, match="both arm 'no head' at seed 0"):
        group_runs([a, twin])


def test_a_constant_shift_on_every_image_has_a_zero_width_paired_interval():
    """Paired on images: B = A + 0.25 on every image gives every replicate exactly −0.25, though A alone varies."""
    a = acc([0.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    b = acc((a.values + 0.25).tolist())
    out = cross_run_difference([(0, a, b)], "linear.acc", n_boot=500)
    assert out["difference"] == pytest.approx(-0.25)
    assert out["ci95"] == pytest.approx([-0.25, -0.25]) and out["per_seed"][0]["ci95_images"] == pytest.approx(
        [-0.25, -0.25])
    assert out["ci95_seeds"] is None and out["n_seeds"] == 1 and out["n_units"] == 6


def test_the_seed_level_resamples_seeds_with_replacement():
    """No image noise (constant values within a seed): per-seed differences 0, 1, 2. A mean of 3 seeds drawn with
    replacement is 0 with probability 1/27 > 2.5% and 2 likewise, so the percentile interval is exactly [0, 2];
    the t interval over seeds is 1 ± t(0.975, 2)·1/√3."""
    pairs = [(s, acc([float(s)] * 6), acc([0.0] * 6)) for s in range(3)]
    out = cross_run_difference(pairs, "linear.acc", n_boot=4000)
    assert out["difference"] == pytest.approx(1.0)
    assert out["ci95"] == pytest.approx([0.0, 2.0])
    half = 4.302652729911275 / 3 ** 0.5
    assert out["ci95_seeds"] == pytest.approx([1 - half, 1 + half])
    assert [p["difference"] for p in out["per_seed"]] == pytest.approx([0.0, 1.0, 2.0])


def test_a_ratio_is_recomputed_on_each_paired_resample():
    g = torch.Generator().manual_seed(0)
    spread, centroids = torch.rand(6, generator=g, dtype=torch.float64), torch.randn(6, 3, generator=g,
                                                                                      dtype=torch.float64)
    a = SpreadRatio(spread, centroids, "images with views")
    b = SpreadRatio(spread, 2 * centroids, "images with views")  # same spreads, centroids twice as far apart
    out = cross_run_difference([(0, a, b)], "view_spread_rel", n_boot=300)
    assert out["difference"] == pytest.approx(a.value() - b.value()) and out["difference"] > 0
    assert out["ci95"][0] <= out["difference"] <= out["ci95"][1]


def test_compare_arms_resolves_in_the_claimed_direction_with_holm_and_checks_the_units(tmp_path):
    g = torch.Generator().manual_seed(1)
    runs_head, runs_none = {}, {}
    for s in range(3):
        base = (torch.rand(200, generator=g) < 0.5).double()
        more = torch.where(torch.rand(200, generator=g) < 0.3, torch.ones(200, dtype=torch.float64), base)
        data = dict(DATA, n_test=200)
        runs_none[s] = fake_run(tmp_path, f"none{s}", IDENTITY, s,
                                {"backbone": {"rotation.acc": acc(base.tolist()), "align": acc(base.tolist())}}, data)
        runs_head[s] = fake_run(tmp_path, f"head{s}", MLP2, s,
                                {"backbone": {"rotation.acc": acc(more.tolist()), "align": acc(base.tolist())}}, data)
    out = compare_arms(runs_head, runs_none, n_boot=1000)
    rot = out["metrics"]["rotation.acc"]
    assert rot["claim"] == "higher with a head" and rot["resolved"] == "for" and rot["ci95"][0] > 0
    assert out["metrics"]["align"]["claim"] == "description" and "resolved" not in out["metrics"]["align"]
    sweep = compare_sweep([*runs_head.values(), *runs_none.values()], n_boot=200)
    assert sweep["reference"] == "no head" and list(sweep["arms"]) == ["mlp d2 relu bn"]
    line = answer_lines(sweep)[0]
    assert line.startswith("mlp d2 relu bn vs no head, backbone rotation.acc: +0.") and line.endswith(" for")
    assert compare_sweep(list(runs_head.values())) is None  # no reference arm
    other = fake_run(tmp_path, "other", MLP2, 0, {"backbone": {"rotation.acc": acc([1.0] * 200)}},
                     dict(DATA, n_test=200, fingerprint="g"))
    with pytest.raises(ValueError, match=r"different test images \(data.fingerprint"):
        compare_arms({0: other}, runs_none)
    with pytest.raises(ValueError, match="kept no per-image values for tap 'head'"):
        compare_arms(runs_head, runs_none, tap="head")
    with pytest.raises(ValueError, match="share no seed"):
        compare_arms({5: other}, runs_none)


@pytest.mark.slow
def test_a_tiny_scratch_sweep_with_and_without_a_head_is_compared_across_runs(tmp_path):
    """scratch:vit-tiny trained from scratch (tune: full) with no head (identity) and an MLP head, 2 seeds: the sweep
    writes cross_run.json; its paired difference per seed equals the two runs' recorded backbone metrics' difference."""
    from headprobe.pipeline import run_sweep

    recipe = {
        "name": "tiny-guillotine", "backbone": {"id": "scratch:vit-tiny", "pooling": "cls", "tune": "full"},
        "data": {"source": "sklearn-digits", "limit": {"train": 60, "test": 20}}, "features": {"batch_size": 60},
        "heads": [{"name": "head", "type": "identity"}], "objective": {"name": "info_nce"},
        "augment": {"preset": "rotation", "views": 2}, "train": {"epochs": 1, "batch_size": 20},
        "probes": {"linear": {"C_grid": [1.0]}, "rotation": {"C_grid": [1.0], "mlp_epochs": 2}, "invariance": {}},
        "report": False,
        "sweep": {"heads.0": [{"name": "head", "type": "identity"},
                              {"name": "head", "type": "mlp", "depth": 2, "width": 16, "act": "swish"}],
                  "seed": [0, 1]},
    }
    results = run_sweep(recipe, out=tmp_path / "sweep", quiet=True)
    assert len(results) == 4 and all(res["status"] == "complete" for res in results)
    paired = json.loads((tmp_path / "sweep" / "cross_run.json").read_text())
    arm = paired["arms"]["mlp d2 swish bn"]
    assert paired["reference"] == "no head" and arm["seeds"] == [0, 1]
    by = {(res["recipe"]["heads"][0]["type"], res["recipe"]["seed"]): res.data for res in results}
    for metric in ("linear.acc", "rotation.acc", "view_spread_rel"):
        record = arm["metrics"][metric]
        for entry in record["per_seed"]:
            s = entry["seed"]
            recorded = [by[(kind, s)]["taps"]["backbone"]["metrics"][metric] for kind in ("mlp", "identity")]
            assert entry["difference"] == pytest.approx(recorded[0] - recorded[1], abs=1e-9), (metric, s)
        assert record["ci95"][0] <= record["difference"] <= record["ci95"][1] and record["n_units"] == 20
    # Before tuning both arms hold the same randomly initialised backbone of their seed: no difference at all.
    arms = group_runs([res.path for res in results])
    untuned = compare_arms(arms["mlp d2 swish bn"], arms["no head"], tap="backbone_untuned", n_boot=200)
    for record in untuned["metrics"].values():
        assert record["difference"] == 0.0 and record["ci95"] == [0.0, 0.0]


def test_a_difference_the_seeds_disagree_on_stays_unresolved(tmp_path):
    """Seed differences +0.5, +0.5, +0.05 (no image noise): every mean of 3 seeds drawn with replacement is ≥ 0.05,
    so the two-level bootstrap excludes 0, but the t interval over the seeds (0.35 ± 0.65) does not: unresolved."""
    runs_head, runs_none = {}, {}
    for s, shift in enumerate((0.5, 0.5, 0.05)):
        base = torch.full((200,), 0.4, dtype=torch.float64)
        data = dict(DATA, n_test=200)
        runs_none[s] = fake_run(tmp_path, f"none{s}", IDENTITY, s, {"backbone": {"rotation.acc": acc(base.tolist())}},
                                data)
        runs_head[s] = fake_run(tmp_path, f"head{s}", MLP2, s,
                                {"backbone": {"rotation.acc": acc((base + shift).tolist())}}, data)
    rot = compare_arms(runs_head, runs_none, n_boot=2000)["metrics"]["rotation.acc"]
    assert rot["ci95"][0] >= 0.05 - 1e-12 and rot["p_holm"] < 0.05
    assert rot["ci95_seeds"][0] < 0 < rot["ci95_seeds"][1]
    assert rot["resolved"] == "unresolved"


def test_a_sweep_over_something_else_is_no_head_ablation(tmp_path):
    """Two runs with the same heads and seed (a sweep over pooling, say), or runs without heads: no comparison."""
    values = {"backbone": {"linear.acc": acc([1.0] * 6)}}
    a = fake_run(tmp_path, "a", IDENTITY, 0, values)
    b = fake_run(tmp_path, "b", IDENTITY, 0, values)
    c = fake_run(tmp_path, "c", MLP2, 0, values)
    assert compare_sweep([a, b, c]) is None
    bare = fake_run(tmp_path, "bare", [], 0, values)
    assert arm_label({"recipe": {"heads": []}}) == "" and group_runs([bare]) == {}
