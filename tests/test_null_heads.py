"""Null heads (recipe/null_heads.py, train/null_heads.py) and answers read against them (stats/against_null.py)."""

import pytest
import torch
from conftest import tiny_recipe_of

from headprobe import run
from headprobe.recipe import RecipeError, load_recipe
from headprobe.recipe.loading import dump_recipe
from headprobe.recipe.null_heads import null_of, with_null_heads
from headprobe.recipe.schema import HeadSpec
from headprobe.record.saved_heads import load_heads
from headprobe.report.claims_table import claims_rows, format_claims, paper_cell
from headprobe.stats.against_null import Difference, change_against
from headprobe.stats.bootstrap import PerUnit, bootstrap_resamples
from headprobe.stats.measures import tap_measures
from headprobe.train.engine import build_head
from headprobe.train.null_heads import RandomInjectiveMap, build_null_heads

HEADS = [{"name": "relu", "act": "relu", "width": 16, "out_dim": 8}, {"name": "lin", "type": "linear", "width": 16}]


def test_null_heads_expand_once_and_follow_their_twin(tmp_path):
    recipe = load_recipe({"heads": HEADS, "null_heads": ["init", "random"]}, ["heads.0.act=swish"])
    names = [h.name for h in recipe.heads]
    assert names == ["relu", "lin", "relu.init", "lin.init", "random"]
    copy = recipe.heads[2]
    assert copy.init_of == "relu" and copy.act == "swish" and copy.width == 16 and copy.out_dim == 8
    assert recipe.heads[4].type == "random" and recipe.heads[4].depth == 1 and recipe.heads[4].width == 16
    # The resolved recipe (config.yaml) loads back to the same heads, and an override of the twin reaches its copy.
    path = tmp_path / "config.yaml"
    path.write_text(dump_recipe(recipe))
    again = load_recipe(path, ["heads.0.width=32"])
    assert [h.name for h in again.heads] == names
    assert again.heads[2].width == 32 and again.heads[2].init_of == "relu"
    assert null_of(recipe.heads, "relu") == "relu.init" and null_of(recipe.heads, "relu.init") is None
    only_random = with_null_heads([HeadSpec(name="a", width=8)], ["random"])
    assert null_of(only_random, "a") == "random"


@pytest.mark.parametrize("heads, needle", [
    ([{"name": "a.init", "init_of": "nope"}], "must name a trained head"),
    ([{"name": "i", "type": "identity"}, {"name": "i0", "init_of": "i"}], "must name a trained head"),
])
def test_a_null_of_nothing_is_refused(heads, needle):
    with pytest.raises(RecipeError, match=needle):
        load_recipe({"heads": heads})


def test_init_copies_on_a_tuned_backbone_are_refused_and_a_random_arm_is_not():
    tuned = {"id": "scratch:vit-tiny", "tune": "full"}
    with pytest.raises(RecipeError, match="null head"):
        load_recipe({"backbone": tuned, "heads": HEADS, "null_heads": ["init"]})
    # The null arm across runs: the backbone trained through a fixed random injective map.
    assert load_recipe({"backbone": tuned, "heads": [{"name": "random", "type": "random"}]}).heads[0].depth == 1


def test_the_random_map_is_injective_and_fixed():
    torch.manual_seed(0)
    m = RandomInjectiveMap(64, 16)  # a narrower width is raised: no map into fewer dimensions is injective
    assert m.out_dim == 64 and not any(p.requires_grad for p in m.parameters())
    w = m.map.weight.double()
    assert torch.linalg.matrix_rank(w) == 64
    wide = RandomInjectiveMap(64, 2048)
    assert torch.linalg.matrix_rank(wide.map.weight.double()) == 64
    assert wide.taps(torch.randn(3, 64))[0].shape == (3, 2048)


def test_an_init_copy_has_exactly_the_weights_its_twin_starts_from():
    specs = with_null_heads([HeadSpec(name="relu", width=16, out_dim=8), HeadSpec(name="lin", type="linear")], ["init"])
    for seed in (0, 3):
        nulls = build_null_heads(specs, 12, seed)
        for twin in ("relu", "lin"):
            built, _ = build_head(specs[0] if twin == "relu" else specs[1], 12, seed)
            copy = nulls[f"{twin}.init"].head
            assert not copy.training
            for (k, a), (_, b) in zip(built.state_dict().items(), copy.state_dict().items(), strict=True):
                assert torch.equal(a, b), k
    a = build_null_heads(specs, 12, 0)["relu.init"].head.layers[0][0].weight
    b = build_null_heads(specs, 12, 1)["relu.init"].head.layers[0][0].weight
    assert not torch.equal(a, b)  # each seed's null is that seed's own initialisation


def _taps(values: dict[str, list[list[float]]]) -> tuple[dict, dict]:
    """taps and per_unit of accuracy-like per-image values {tap: [per seed: per image]}."""
    taps, per_unit = {}, {}
    for tap, seeds in values.items():
        means = [float(torch.tensor(v, dtype=torch.float64).mean()) for v in seeds]
        taps[tap] = {"metrics": {"m.acc": sum(means) / len(means)}}
        if len(seeds) > 1:
            taps[tap]["seeds"] = {str(s): {"metrics": {"m.acc": means[s]}} for s in range(len(seeds))}
            for s, v in enumerate(seeds):
                per_unit[f"{tap}.seed-{s}"] = {"m.acc": PerUnit(torch.tensor(v, dtype=torch.float64), "test images")}
        else:
            per_unit[tap] = {"m.acc": PerUnit(torch.tensor(seeds[0], dtype=torch.float64), "test images")}
    return taps, per_unit


def test_the_change_against_a_null_is_the_paired_bootstrap_of_the_per_image_differences():
    gen = torch.Generator().manual_seed(0)
    head, null = (torch.rand(200, generator=gen) < 0.8).double(), (torch.rand(200, generator=gen) < 0.7).double()
    taps, per_unit = _taps({"h": [head.tolist()], "n": [null.tolist()]})
    resamples = {"test images": bootstrap_resamples(200, n_boot=500, seed=1)}
    change = change_against(tap_measures(taps, per_unit), resamples, "h", "n", "m.acc")
    assert change.change == pytest.approx(float((head - null).mean()), abs=1e-12)
    # Independently: the resampled means of the differences, image by image.
    idx = resamples["test images"].indices
    boot = (head - null)[idx].mean(1)
    lo, hi = torch.quantile(boot, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    assert change.ci95 == pytest.approx([lo, hi], abs=1.5 / 200)
    assert change.backbone == pytest.approx(float(null.mean())) and change.head == pytest.approx(float(head.mean()))
    assert Difference(per_unit["h"]["m.acc"], per_unit["n"]["m.acc"]).value() == pytest.approx(change.change)


def test_with_seeds_each_seed_is_read_against_its_own_null():
    gen = torch.Generator().manual_seed(2)
    base = torch.rand(3, 150, generator=gen)
    heads = (base < 0.8).double().tolist()
    nulls = (base < 0.6).double().tolist()  # the same images fall: each seed's null below its head
    taps, per_unit = _taps({"h": heads, "n": nulls})
    resamples = {"test images": bootstrap_resamples(150, n_boot=400)}
    change = change_against(tap_measures(taps, per_unit), resamples, "h", "n", "m.acc")
    per_seed = [float((torch.tensor(a) - torch.tensor(b)).mean()) for a, b in zip(heads, nulls, strict=True)]
    assert change.per_seed == pytest.approx(per_seed) and change.n_seeds == 3
    assert change.kind in ("hierarchical bootstrap", "t over seeds")
    assert change.ci95[0] <= change.change <= change.ci95[1]
    taps_one, per_unit_one = _taps({"h": heads, "n": [nulls[0]]})
    assert change_against(tap_measures(taps_one, per_unit_one), {}, "h", "n", "m.acc") is None  # seeds that do not pair


@pytest.mark.slow
def test_a_run_with_null_heads_reads_every_answer_against_them(tiny_dinov2, tmp_path):
    recipe = {**tiny_recipe_of(tiny_dinov2), "heads": HEADS, "null_heads": ["init", "random"],
              "augment": {"preset": "rotation", "views": 2}, "train": {"epochs": 2, "batch_size": 50},
              "probes": {"linear": {"C_grid": [0.1, 1.0]}, "rotation": {}, "invariance": {}}}
    results = run(recipe, out=tmp_path / "r", quiet=True)
    assert {"relu.init@1", "relu.init", "lin.init", "random"} <= set(results["taps"])
    assert results["heads"]["relu.init"]["train"]["steps"] == 0
    assert "null" in results["heads"]["random"]["train"]["status"]
    for key, question in results["claims"].items():
        relu, null = question["heads"]["relu"], question["heads"]["relu.init"]
        vs = relu["vs_null"]
        assert vs["null"] == "relu.init"
        assert vs["change"] == pytest.approx(relu["head"] - null["head"], abs=1e-9)
        assert relu["decided_on"] == ("head − backbone" if key == "Q-class" else "head − null")
        assert null["is_null"] and "null head" in null["line"] and "against its null relu.init" in relu["line"]
        if key != "Q-class":
            assert relu["answer"] in ("yes", "no", "undecided")
            assert relu["answer"] == "undecided" or relu["p_holm"] < 0.05
    # The paper's table (`headprobe claims`) carries the change against the null next to the one against the backbone.
    rows = {(r["question"], r["head"]): r for r in claims_rows({"run": results.data})}
    aug = rows[("Q-aug", "relu")]
    assert aug["null"] == "relu.init" and aug["change_vs_null"] == pytest.approx(
        results["claims"]["Q-aug"]["heads"]["relu"]["vs_null"]["change"])
    assert "; vs relu.init: " in paper_cell(aug) and paper_cell(aug).endswith(", decides)")
    assert "decides" not in paper_cell(rows[("Q-class", "relu")]) and "null" not in rows[("Q-aug", "relu.init")]
    assert "relu.init" in format_claims(list(rows.values()), "csv")


@pytest.mark.slow
def test_a_backbone_trains_through_a_fixed_random_map(tmp_path):
    """The null arm of a guillotine sweep: the backbone is tuned through the random map, which itself never moves."""
    recipe = {"name": "random-arm", "backbone": {"id": "scratch:vit-tiny", "pooling": "cls", "tune": "full",
                                                 "resolution": 16},
              "data": {"source": "sklearn-digits", "limit": {"train": 60, "test": 30}}, "features": {"batch_size": 60},
              "heads": [{"name": "random", "type": "random", "width": 256}], "objective": {"name": "vicreg"},
              "augment": {"preset": "crop-flip", "views": 2}, "train": {"epochs": 1, "batch_size": 20},
              "probes": {"linear": {"C_grid": [1.0]}}, "report": False}
    results = run(recipe, out=tmp_path / "r", quiet=True)
    assert results["backbone_tuned"] and {"backbone", "backbone_untuned", "random"} <= set(results["taps"])
    assert results["taps"]["backbone"]["metrics"] != results["taps"]["backbone_untuned"]["metrics"]
    assert "is_null" not in results["claims"]["Q-class"]["heads"]["random"]  # it trained the backbone: an arm
    built = build_null_heads(load_recipe(recipe).heads, 192, 0)["random"].head.map.weight
    saved = load_heads(tmp_path / "r")["random"].map.weight
    assert torch.equal(saved, built)  # never updated: still its draw from (seed, name)
