"""Claim 5 across runs (headprobe/stats/cross_run.py): arms and seeds of a head ablation, the changes paired on the
same test images with the crossed (seeds × images) interval, and the per-arm answers of `headprobe claims`."""

import json
from pathlib import Path

import pytest
import torch

from headprobe.stats.answers import claims_record
from headprobe.stats.bootstrap import PerUnit, SpreadRatio, bootstrap_resamples, holm, save_per_unit
from headprobe.stats.claims import answer_questions
from headprobe.stats.cross_run import (
    answer_lines,
    arm_label,
    cross_run_answers,
    group_runs,
    paired_changes,
    read_run,
)
from headprobe.stats.measures import tap_measures
from headprobe.stats.retraining import HIERARCHICAL, IMAGES_ONLY, T_SEEDS, change_interval

DATA = {"source": "fashion-mnist", "fingerprint": "f", "limit": {"train": 10, "test": 6}, "split_seed": 0, "n_test": 6}
IDENTITY = [{"name": "head", "type": "identity"}]
MLP2 = [{"name": "head", "type": "mlp", "depth": 2, "act": "relu", "bn_hidden": True}]
LINEAR = [{"name": "head", "type": "linear", "depth": 2}]
UNIT = "test images"


def fake_run(root: Path, name: str, heads: list, seed: int, tap_values: dict, data: dict = DATA) -> Path:
    """A finished run: results.json (its taps' metrics, the per-unit means, and its own answers where it has a
    backbone and a head tap) and per_unit/TAP.safetensors."""
    path = root / name
    (path / "per_unit").mkdir(parents=True)
    taps = {tap: {"metrics": {m: x.value() for m, x in stats.items()}} for tap, stats in tap_values.items()}
    results = {"schema_version": 3, "status": "complete", "recipe": {"seed": seed, "heads": heads}, "data": data,
               "taps": taps,
               "protocol": {"views_probed": {"split": "test", "n_images": 6, "views": 2, "seed": 100 + seed}}}
    if {"backbone", "head"} <= set(taps):
        results["claims"] = claims_record(answer_questions(tap_measures(taps, tap_values), {}, {"head": "head"}))
    (path / "results.json").write_text(json.dumps(results))
    for tap, stats in tap_values.items():
        save_per_unit(path / "per_unit" / f"{tap}.safetensors", stats)
    return path


def acc(values) -> PerUnit:
    return PerUnit(torch.as_tensor(values, dtype=torch.float64), UNIT)


def test_arms_are_named_by_their_heads_and_keyed_by_seed(tmp_path):
    a = fake_run(tmp_path, "a", IDENTITY, 0, {"backbone": {"linear.acc": acc([1.0] * 6)}})
    b = fake_run(tmp_path, "b", MLP2, 0, {"backbone": {"linear.acc": acc([1.0] * 6)}})
    assert arm_label({"recipe": {"heads": IDENTITY}}) == "no head"
    assert arm_label({"recipe": {"heads": [{"type": "linear", "depth": 2}]}}) == "linear d2"
    one_layer = {"type": "mlp", "depth": 1, "act": "swish", "bn_hidden": True, "bn_out": True}
    assert arm_label({"recipe": {"heads": [one_layer]}}) == "mlp d1 bn-out"  # no activation in one layer
    arms = group_runs([read_run(a), read_run(b)])
    assert {label: {s: run.path for s, run in runs.items()} for label, runs in arms.items()} == {
        "no head": {0: a}, "mlp d2 relu bn": {0: b}}
    twin = fake_run(tmp_path, "c", IDENTITY, 0, {"backbone": {"linear.acc": acc([1.0] * 6)}})
    with pytest.raises(ValueError, match="both arm 'no head' at seed 0"):
        group_runs([read_run(a), read_run(twin)])


def _record(stats: dict) -> tuple[dict, dict]:
    return {m: x.value() for m, x in stats.items()}, stats


def test_a_constant_shift_on_every_image_has_a_zero_width_paired_interval():
    """Paired on images: B = A + 0.25 on every image gives every replicate exactly −0.25, though A alone varies."""
    a = acc([0.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    b = acc(a.values + 0.25)
    out = paired_changes([(0, _record({"linear.acc": a}), _record({"linear.acc": b}))], n_boot=500)["linear.acc"]
    assert out.change == pytest.approx(-0.25) and out.ci95 == pytest.approx([-0.25, -0.25])
    assert out.kind == IMAGES_ONLY and "seed: [0, 1, 2]" in out.how and (out.n_seeds, out.n_units) == (1, 6)


def test_every_seed_reads_the_same_image_resample():
    """Each image's difference d_i repeats in both seeds: whichever seeds a replicate draws, it is the mean of d
    over that replicate's ONE image resample, so the replicates are exactly the image bootstrap of d (independent
    draws per seed would average d's resampling noise over the seeds and be narrower)."""
    g = torch.Generator().manual_seed(3)
    base, d = torch.rand(50, generator=g, dtype=torch.float64), torch.randn(50, generator=g, dtype=torch.float64)
    pairs = [(s, _record({"rotation.acc": acc(base + d + s)}), _record({"rotation.acc": acc(base + s)}))
             for s in (0, 1)]
    out = paired_changes(pairs, n_boot=400, seed=5)["rotation.acc"]
    assert out.kind == HIERARCHICAL and out.per_seed == pytest.approx([float(d.mean())] * 2)
    assert torch.allclose(out.boot, bootstrap_resamples(50, 400, seed=5).weights @ d, atol=1e-12)


def test_seeds_that_disagree_get_the_t_interval_over_seeds():
    """No image noise, per-seed differences 0, 1, 2: the t interval over seeds, 1 ± t(0.975, 2)·1/√3, is wider than
    the bootstrap's [0, 2] (3 seeds drawn with replacement), so it is the interval."""
    pairs = [(s, _record({"linear.acc": acc([float(s)] * 6)}), _record({"linear.acc": acc([0.0] * 6)}))
             for s in range(3)]
    out = paired_changes(pairs, n_boot=4000)["linear.acc"]
    half = 4.302652729911275 / 3 ** 0.5
    assert out.kind == T_SEEDS and out.ci95 == pytest.approx([1 - half, 1 + half])
    assert out.change == pytest.approx(1.0) and out.per_seed == pytest.approx([0.0, 1.0, 2.0])
    assert "[0, 2]" not in out.how and "0 to 2" in out.how  # the narrower bootstrap interval, named


def test_a_ratio_is_recomputed_on_each_paired_resample():
    g = torch.Generator().manual_seed(0)
    spread, centroids = torch.rand(6, generator=g, dtype=torch.float64), torch.randn(6, 3, generator=g,
                                                                                      dtype=torch.float64)
    a = SpreadRatio(spread, centroids, "images with views")
    b = SpreadRatio(spread, 2 * centroids, "images with views")  # same spreads, centroids twice as far apart
    out = paired_changes([(0, _record({"view_spread_rel": a}), _record({"view_spread_rel": b}))], n_boot=300)
    change = out["view_spread_rel"]
    resamples = bootstrap_resamples(6, 300, seed=0)
    assert change.change == pytest.approx(a.value() - b.value()) and change.change > 0
    assert torch.allclose(change.boot, resamples.replicates_of(a) - resamples.replicates_of(b), atol=1e-12)


def _ablation(root: Path, n: int = 200) -> dict[str, dict[int, Path]]:
    """3 seeds × arms no head, mlp (its backbone keeps rotation on 30% more images; its head loses it) and linear
    (nothing changes), on n test images; linear.acc and knn.k20.acc the same everywhere."""
    g = torch.Generator().manual_seed(1)
    data = dict(DATA, n_test=n)
    arms = {"none": {}, "mlp": {}, "linear": {}}
    for s in range(3):
        base = (torch.rand(n, generator=g) < 0.5).double()
        more = torch.where(torch.rand(n, generator=g) < 0.3, torch.ones(n, dtype=torch.float64), base)
        label = (torch.rand(n, generator=g) < 0.8).double()
        shared = {"linear.acc": acc(label), "knn.k20.acc": acc(label)}
        arms["none"][s] = fake_run(root, f"none{s}", IDENTITY, s, {"backbone": {"rotation.acc": acc(base), **shared},
                                                                  "head": {"rotation.acc": acc(base), **shared}}, data)
        arms["mlp"][s] = fake_run(root, f"mlp{s}", MLP2, s, {"backbone": {"rotation.acc": acc(more), **shared},
                                                            "head": {"rotation.acc": acc(base * 0), **shared}}, data)
        arms["linear"][s] = fake_run(root, f"linear{s}", LINEAR, s, {"backbone": {"rotation.acc": acc(base), **shared},
                                                                    "head": {"rotation.acc": acc(base), **shared}},
                                     data)
    return arms


def test_the_answers_across_runs_per_arm_with_holm_across_arms(tmp_path):
    arms = _ablation(tmp_path)
    runs = [p for arm in arms.values() for p in arm.values()]
    out = cross_run_answers(runs, n_boot=500)
    assert out["reference"] == "no head" and set(out["arms"]) == {"mlp d2 relu bn", "linear d2"}
    aug = out["across"]["Q-aug"]
    assert aug["predicted"] == "higher at the backbone trained with the head" and "arms" in aug["answer_rule"]
    mlp, linear = aug["arms"]["mlp d2 relu bn"], aug["arms"]["linear d2"]
    # The interval is change_interval's with one no-head reference per seed, on one shared resample of the images.
    stats = {arm: [json.loads((arms[arm][s] / "results.json").read_text()) for s in range(3)] for arm in arms}
    from headprobe.stats.bootstrap import load_per_unit

    values = {arm: [load_per_unit(arms[arm][s] / "per_unit" / "backbone.safetensors")["rotation.acc"]
                    for s in range(3)] for arm in arms}
    expected = change_interval([x.value() for x in values["none"]], [x.value() for x in values["mlp"]],
                               values["none"], values["mlp"], {UNIT: bootstrap_resamples(200, 500)}, seed=0)
    assert mlp["change"] == pytest.approx(expected.change) and mlp["ci95"] == pytest.approx(expected.ci95)
    assert mlp["per_seed_change"] == pytest.approx(
        [r["taps"]["backbone"]["metrics"]["rotation.acc"] - n["taps"]["backbone"]["metrics"]["rotation.acc"]
         for r, n in zip(stats["mlp"], stats["none"], strict=True)])
    assert mlp["seeds"] == [0, 1, 2] and mlp["n_units"] == 200 and mlp["change"] > 0.1
    assert mlp["answer"] == "yes" and linear["change"] == 0.0 and linear["answer"] == "undecided"
    assert {a: r["p_holm"] for a, r in aug["arms"].items()} == pytest.approx(
        holm({a: r["p"] for a, r in aug["arms"].items()}))
    assert mlp["line"].startswith("Q-aug: backbone trained with the mlp d2 relu bn head keeps more augmentation "
                                  "information than the no-head backbone (rotation.acc): +")
    assert mlp["line"].endswith("3 seeds × 200 test images — yes")
    # Q-class decides on linear.acc alone; k-NN is a description (a secondary measure with no answer).
    cls = out["across"]["Q-class"]["arms"]["mlp d2 relu bn"]
    assert cls["answer"] == "equivalent" and "knn.k20.acc" in cls["secondary"]
    assert "answer" not in cls["secondary"]["knn.k20.acc"] and "knn.k20.acc" not in aug["arms"]["mlp d2 relu bn"][
        "secondary"]
    assert out["across"]["Q-inv"]["arms"] == {}  # view_spread_rel not probed: nothing to answer or describe


def test_the_answers_within_an_arm_pool_its_runs(tmp_path):
    """z → h at each run's head, pooled over the arm's 3 runs, each seed against its own backbone."""
    arms = _ablation(tmp_path)
    out = cross_run_answers([p for arm in arms.values() for p in arm.values()], n_boot=500)
    within = out["within"]["Q-aug"]["arms"]
    assert set(within) == {"mlp d2 relu bn", "linear d2"}  # the no-head arm's identity head is no head
    mlp = within["mlp d2 relu bn"]
    per_run = [json.loads((arms["mlp"][s] / "results.json").read_text())["claims"]["Q-aug"]["heads"]["head"]
               for s in range(3)]
    assert mlp["per_seed_change"] == pytest.approx([r["change"] for r in per_run])
    assert mlp["tap"] == "head" and mlp["answer"] == "yes" and mlp["n_seeds"] == 3
    assert mlp["line"].startswith("Q-aug: mlp d2 relu bn head discards augmentation information (rotation.acc): −")
    lines = answer_lines(out)
    assert lines[0].startswith("within each arm") and mlp["line"] in lines
    assert out["across"]["Q-aug"]["arms"]["mlp d2 relu bn"]["line"] in lines


def test_runs_that_cannot_be_paired_are_refused_or_no_head_ablation(tmp_path):
    values = {"backbone": {"linear.acc": acc([1.0] * 6)}}
    a = fake_run(tmp_path, "a", IDENTITY, 0, values)
    b = fake_run(tmp_path, "b", IDENTITY, 0, values)
    c = fake_run(tmp_path, "c", MLP2, 0, values)
    assert cross_run_answers([a, b, c]) is None  # two runs of one arm and seed: a sweep over something else
    assert cross_run_answers([c]) is None  # no reference arm
    bare = fake_run(tmp_path, "bare", [], 0, values)
    assert arm_label({"recipe": {"heads": []}}) == "" and group_runs([read_run(bare)]) == {}
    other = fake_run(tmp_path, "other", MLP2, 0, values, dict(DATA, fingerprint="g"))
    with pytest.raises(ValueError, match=r"different test images \(data.fingerprint"):
        cross_run_answers([a, other])


@pytest.mark.slow
def test_a_tiny_scratch_sweep_with_and_without_a_head_is_answered_across_runs(tmp_path):
    """scratch:vit-tiny trained from scratch (tune: full) with no head (identity) and an MLP head, 2 seeds: the
    sweep writes cross_run.json; its per-seed changes across runs equal the two runs' recorded backbone metrics'
    difference."""
    from headprobe.pipeline import run_sweep
    from headprobe.stats.cross_run import tap_record

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
    assert paired["reference"] == "no head" and paired["arms"]["mlp d2 swish bn"]["seeds"] == [0, 1]
    by = {(res["recipe"]["heads"][0]["type"], res["recipe"]["seed"]): res.data for res in results}
    for question, metric in (("Q-class", "linear.acc"), ("Q-aug", "rotation.acc"), ("Q-inv", "view_spread_rel")):
        record = paired["across"][question]["arms"]["mlp d2 swish bn"]
        recorded = [by[("mlp", s)]["taps"]["backbone"]["metrics"][metric]
                    - by[("identity", s)]["taps"]["backbone"]["metrics"][metric] for s in (0, 1)]
        assert record["per_seed_change"] == pytest.approx(recorded, abs=1e-9), metric
        assert record["ci95"][0] <= record["change"] <= record["ci95"][1] and record["n_units"] == 20
    assert paired["within"]["Q-aug"]["arms"]["mlp d2 swish bn"]["n_seeds"] == 2
    # Before tuning both arms hold the same randomly initialised backbone of their seed: no difference at all.
    arms = group_runs([read_run(res.path, "backbone_untuned") for res in results])
    untuned = paired_changes([(s, tap_record(arms["mlp d2 swish bn"][s], "backbone_untuned"),
                               tap_record(arms["no head"][s], "backbone_untuned")) for s in (0, 1)], n_boot=200)
    assert untuned and all(c.change == 0.0 and c.ci95 in (None, [0.0, 0.0]) for c in untuned.values())


def test_the_claims_command_on_a_sweep_folder_prints_the_pooled_and_cross_run_rows(tmp_path, capsys):
    import csv
    import io

    from headprobe.cli import main
    from headprobe.report.claims_table import ACROSS_HEADER, paper_cell

    arms = _ablation(tmp_path / "sweep")
    answers = cross_run_answers([p for arm in arms.values() for p in arm.values()])
    assert main(["claims", str(tmp_path / "sweep")]) == 0
    out = capsys.readouterr().out
    across = answers["across"]["Q-aug"]["arms"]["mlp d2 relu bn"]
    cell = paper_cell({"measure": "rotation.acc", "backbone": across["backbone"], "head_value": across["head"],
                       "change": across["change"], "ci95": across["ci95"], "n_seeds": 3, "n_units": 200})
    assert f"| Q-aug | rotation.acc | across runs | mlp d2 relu bn | {cell} | yes |" in out
    assert "| " + " | ".join(ACROSS_HEADER) + " |" in out
    assert "| Q-aug | rotation.acc | pooled runs | mlp d2 relu bn |" in out and "| none0 | head |" in out
    assert main(["claims", str(tmp_path / "sweep"), "--format", "csv", "--secondary"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    row = next(r for r in rows if r["run"] == "across runs" and r["question"] == "Q-aug" and r["role"] == "primary"
               and r["head"] == "mlp d2 relu bn")
    assert float(row["change"]) == across["change"] and float(row["p_holm"]) == across["p_holm"]
    assert [float(row["ci_low"]), float(row["ci_high"])] == across["ci95"] and row["tap"] == "backbone"
    knn = [r for r in rows if r["measure"] == "knn.k20.acc" and r["run"] == "across runs"]
    assert knn and all(r["role"] == "secondary" and r["answer"] == "" for r in knn)
    assert main(["claims", str(tmp_path / "sweep"), "--format", "latex"]) == 0
    assert "across runs & mlp d2 relu bn" in capsys.readouterr().out


def test_a_run_that_tuned_its_backbone_per_seed_counts_as_its_seeds(tmp_path):
    """The ablation with each arm's 3 seeds in one run (seeds: [0, 1, 2] with a tuned backbone: per-seed taps and
    TAP.seed-S stores) gives the same answers as one run per seed."""
    arms = _ablation(tmp_path / "separate")
    packed = []
    for name, runs in arms.items():
        results = [json.loads((runs[s] / "results.json").read_text()) for s in range(3)]
        path = tmp_path / "packed" / name
        (path / "per_unit").mkdir(parents=True)
        taps = {tap: {"metrics": results[0]["taps"][tap]["metrics"],  # (not the seed mean: never read here)
                      "seeds": {str(s): results[s]["taps"][tap] for s in range(3)}} for tap in ("backbone", "head")}
        for s in range(3):
            for tap in ("backbone", "head"):
                (path / "per_unit" / f"{tap}.seed-{s}.safetensors").write_bytes(
                    (runs[s] / "per_unit" / f"{tap}.safetensors").read_bytes())
        (path / "results.json").write_text(json.dumps(results[0] | {"taps": taps}))
        packed.append(path)
    packed_arm = group_runs([read_run(p) for p in packed])["mlp d2 relu bn"]
    assert {s: run.path for s, run in packed_arm.items()} == {s: tmp_path / "packed" / "mlp" for s in range(3)}
    one = cross_run_answers([p for arm in arms.values() for p in arm.values()], n_boot=300)
    other = cross_run_answers(packed, n_boot=300)
    for part in ("within", "across"):
        for question in ("Q-aug", "Q-class"):
            for arm, record in one[part][question]["arms"].items():
                mine = other[part][question]["arms"][arm]
                assert (mine["change"], mine["ci95"], mine["answer"]) == (record["change"], record["ci95"],
                                                                          record["answer"]), (part, question, arm)


def test_the_heads_answered_within_an_arm_are_its_trained_heads(tmp_path):
    from headprobe.stats.cross_run import head_taps

    results = {"recipe": {"heads": MLP2 + [{"name": "z", "type": "identity"}]},
               "claims": {"Q-aug": {"heads": {"head": {"tap": "head@2"}, "z": {"tap": "z"},
                                              "head.init": {"tap": "head.init@2", "is_null": True}}}}}
    assert head_taps(results) == {"head": "head@2"}


def test_a_null_arm_is_a_second_reference_for_every_other_arm(tmp_path):
    """The backbone trained through a fixed random map (type: random): each arm against it, seed by seed."""
    arms = _ablation(tmp_path)
    for s, path in list(arms["linear"].items()):  # the linear arm's values, relabelled as the null arm's runs
        null = tmp_path / f"random{s}"
        null.mkdir()
        results = json.loads((path / "results.json").read_text())
        results["recipe"]["heads"] = [{"name": "head", "type": "random", "depth": 1, "width": 16}]
        (null / "results.json").write_text(json.dumps(results))
        (null / "per_unit").symlink_to(path / "per_unit")
    runs = [p for arm in arms.values() for p in arm.values()] + [tmp_path / f"random{s}" for s in range(3)]
    out = cross_run_answers(runs, n_boot=500)
    assert out["null_arm"] == "random d1"
    against = out["against_null"]["Q-aug"]["arms"]
    assert set(against) == {"mlp d2 relu bn", "linear d2"}  # not the null arm against itself
    across = out["across"]["Q-aug"]["arms"]
    # The null arm holds the linear arm's (= the no-head arm's) backbones: the same change and interval as vs no head.
    assert against["mlp d2 relu bn"]["change"] == pytest.approx(across["mlp d2 relu bn"]["change"])
    assert against["linear d2"]["change"] == 0.0
    assert "against the null arm's" in against["mlp d2 relu bn"]["line"]
    assert any("null arm (random d1" in line for line in answer_lines(out))
