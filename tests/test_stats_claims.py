"""The paper's questions answered per head (headprobe/stats/claims.py): the answers against exact t tests, Holm
across the heads of one question, recipe overrides, and what a tiny run concludes."""

import pytest
import torch
from scipy import stats as scipy_stats

from headprobe import run
from headprobe.recipe import RecipeError, load_recipe
from headprobe.stats.answer_text import answer_line
from headprobe.stats.bootstrap import PerUnit, bootstrap_resamples, holm
from headprobe.stats.claims import QUESTIONS, answer_questions, check_claims_section
from headprobe.stats.measures import tap_measures


def _taps(backbone: dict, heads: dict[str, list[dict]]) -> dict:
    """results["taps"] with a backbone and, per head, its per-seed metrics (their mean as the tap's metrics)."""
    taps = {"backbone": {"head": None, "metrics": backbone}}
    for name, seeds in heads.items():
        mean = {m: sum(s[m] for s in seeds) / len(seeds) for m in seeds[0]}
        taps[name] = {"head": name, "metrics": mean, "seeds": {str(i): {"metrics": s} for i, s in enumerate(seeds)}}
    return taps


def _seeds(metric: str, base: float, changes: list[float]) -> list[dict]:
    return [{metric: base + c} for c in changes]


def test_direction_answers_follow_the_t_test_over_seeds_and_holm_across_heads():
    lower = [-0.10, -0.08, -0.12]  # clearly lower: "yes"
    higher = [0.10, 0.09, 0.12]  # clearly the other way: "no"
    unclear = [-0.05, 0.04, -0.01]
    taps = _taps({"rotation.acc": 0.8}, {"a": _seeds("rotation.acc", 0.8, lower),
                                         "b": _seeds("rotation.acc", 0.8, higher),
                                         "c": _seeds("rotation.acc", 0.8, unclear)})
    out = answer_questions(tap_measures(taps), {}, {"a": "a", "b": "b", "c": "c"})["Q-aug"]
    heads = out.heads
    p = {h: scipy_stats.ttest_1samp(c, 0.0).pvalue for h, c in (("a", lower), ("b", higher), ("c", unclear))}
    for head in "abc":
        assert heads[head].p == pytest.approx(p[head], rel=1e-9)
    expected = holm(p)
    assert {h: heads[h].p_holm for h in heads} == pytest.approx(expected)
    assert [heads[h].answer for h in "abc"] == ["yes", "no", "undecided"]
    assert heads["a"].change.kind == "t over seeds" and heads["a"].n_seeds == 3
    assert heads["a"].change.change == pytest.approx(-0.10)
    assert out.primary == "rotation.acc" and out.predicted == "lower at the head"
    assert answer_questions(tap_measures(taps), {}, {"a": "a"})["Q-inv"].not_measured is not None


def test_holm_corrects_across_the_heads_of_one_question_only():
    changes = [-0.050, -0.035, -0.065]
    p_alone = scipy_stats.ttest_1samp(changes, 0.0).pvalue
    strong = [-0.050, -0.049, -0.051]  # linear.acc: another question's strong p-value, not part of Q-aug's family
    assert 0.025 < p_alone < 0.05  # resolved alone; doubled (two heads) it is not
    one = answer_questions(tap_measures(_taps({"rotation.acc": 0.8, "linear.acc": 0.9},
                                 {"a": [{"rotation.acc": 0.8 + c, "linear.acc": 0.9 + s}
                                        for c, s in zip(changes, strong, strict=True)]})), {}, {"a": "a"})
    assert one["Q-aug"].heads["a"].p_holm == pytest.approx(p_alone)
    assert one["Q-aug"].heads["a"].answer == "yes"
    # A second head on the same question doubles the smaller p-value; other questions' p-values are not counted.
    two = answer_questions(tap_measures(_taps({"rotation.acc": 0.8}, {"a": _seeds("rotation.acc", 0.8, changes),
                                                         "b": _seeds("rotation.acc", 0.8, changes)})),
                           {}, {"a": "a", "b": "b"})["Q-aug"].heads
    assert two["a"].p_holm == pytest.approx(min(1.0, 2 * p_alone))
    assert two["a"].answer == two["b"].answer == "undecided"


@pytest.mark.parametrize("changes, answer", [
    ([0.004, -0.003, 0.001], "equivalent"),
    ([-0.30, -0.28, -0.33], "lost"),
    ([0.30, 0.28, 0.33], "gained"),
    ([-0.03, 0.02, -0.05], "undecided"),
])
def test_class_information_is_an_equivalence_question_with_a_margin(changes, answer):
    taps = _taps({"linear.acc": 0.6}, {"h": _seeds("linear.acc", 0.6, changes)})
    answered = answer_questions(tap_measures(taps), {}, {"h": "h"})["Q-class"].heads["h"]
    assert answered.answer == answer
    lo, hi = answered.ci95
    assert {"equivalent": -0.02 < lo and hi < 0.02, "lost": hi < -0.02, "gained": lo > 0.02,
            "undecided": lo < 0.02 and hi > -0.02 and not (-0.02 < lo and hi < 0.02)}[answer]


def test_one_seed_answers_from_test_images_and_says_so():
    g = torch.Generator().manual_seed(0)
    correct_b = (torch.rand(300, generator=g) < 0.9).double()
    correct_h = correct_b * (torch.rand(300, generator=g) < 0.7).double()  # loses 30% of what it had
    per_unit = {"backbone": {"rotation.acc": PerUnit(correct_b, "test images")},
                "h": {"rotation.acc": PerUnit(correct_h, "test images")}}
    taps = {"backbone": {"metrics": {"rotation.acc": float(correct_b.mean())}},
            "h": {"head": "h", "metrics": {"rotation.acc": float(correct_h.mean())}}}
    resamples = {"test images": bootstrap_resamples(300, 2000)}
    record = answer_questions(tap_measures(taps, per_unit), resamples, {"h": "h"})["Q-aug"].heads["h"].to_record()
    assert record["interval"] == "test images only" and record["answer"] == "yes"
    assert record["n_units"] == 300 and record["n_seeds"] == 1
    assert "interval over the test images only" in record["line"]
    assert record["change"] == pytest.approx(float((correct_h - correct_b).mean()))


def test_the_answer_line_reads_as_the_paper_would():
    record = {"change": -0.074, "ci95": [-0.119, -0.021], "n_seeds": 3, "n_units": 200, "unit": "test images",
              "interval": "hierarchical bootstrap", "answer": "yes"}
    assert answer_line(QUESTIONS["Q-aug"], "d2", record) == (
        "Q-aug: d2 head discards augmentation information (rotation.acc): −7.4 points [−11.9, −2.1], "
        "3 seeds × 200 test images — yes")
    assert answer_line(QUESTIONS["Q-class"], "d2", record | {"change": 0.004, "answer": "equivalent"}).startswith(
        "Q-class: d2 head keeps the class information (linear.acc, margin ±2.0 points): +0.4 points")


def test_a_recipe_overrides_a_primary_or_margin_and_the_override_is_recorded():
    taps = _taps({"linear.acc": 0.6, "rotation.mlp.acc": 0.7},
                 {"h": [{"linear.acc": 0.6 + c, "rotation.mlp.acc": 0.6 + c} for c in (-0.03, -0.035, -0.04)]})
    default = answer_questions(tap_measures(taps), {}, {"h": "h"})
    assert default["Q-class"].heads["h"].answer == "lost"
    assert default["Q-aug"].not_measured is not None  # rotation.acc was not measured
    override = {"Q-class": {"margin": 0.05}, "Q-aug": {"primary": "rotation.mlp.acc"}}
    out = answer_questions(tap_measures(taps), {}, {"h": "h"}, override)
    assert out["Q-class"].heads["h"].answer == "equivalent" and out["Q-class"].margin == 0.05
    assert out["Q-class"].override == {"margin": 0.05}
    assert out["Q-aug"].primary == "rotation.mlp.acc" and out["Q-aug"].heads["h"].answer == "yes"
    assert out["Q-class"].to_record()["override"] == {"margin": 0.05}


@pytest.mark.parametrize("claims, words", [
    ({"Q-cls": {}}, "claims.Q-cls is not a question; the questions are Q-aug, Q-inv, Q-class"),
    ({"Q-aug": {"primary": "knn.k20.acc"}}, "does not answer Q-aug; choose among rotation.acc"),
    ({"Q-class": {"margin": -0.1}}, "claims.Q-class.margin = -0.1 is out of range"),
    ({"Q-class": {"level": 0.9}}, "claims.Q-class.level cannot be set; a recipe may set primary, margin"),
    ({"Q-inv": {"primary": "rotation45.orbit.spread_rel"}}, None),
])
def test_a_recipe_s_claims_section_is_checked_with_a_sentence(claims, words):
    if words is None:
        check_claims_section(claims)
        assert load_recipe({"claims": claims, "probes": ["linear", "orbits"]}).claims == claims  # orbits measures it
        return
    with pytest.raises(RecipeError, match=words.replace(".", r"\.").replace("(", r"\(")):
        load_recipe({"claims": claims})


@pytest.mark.slow
def test_a_tiny_run_answers_each_question_for_each_head(tiny_recipe, tmp_path):
    recipe = {**tiny_recipe, "seeds": [0, 1, 2],
              "probes": {"linear": {"C_grid": [0.01, 0.1, 1.0]}, "knn": {"ks": [5]}, "invariance": {},
                         "rotation": {"C_grid": [0.1, 1.0], "mlp_epochs": 5}},
              # A 2-d output cannot hold the 10 digit classes a 32-d backbone separates: class information lost.
              "heads": [{"name": "narrow", "act": "relu", "width": 16, "out_dim": 2},
                        {"name": "ident", "type": "identity"}],
              "objective": {"name": "vicreg"}, "augment": {"preset": "crop-flip", "views": 2},
              "train": {"epochs": 2, "batch_size": 50, "log_every": 2}}
    results = run(recipe, out=tmp_path / "run", quiet=True)
    claims, taps = results["claims"], results["taps"]
    narrow, ident = ({q: claims[q]["heads"][h] for q in claims} for h in ("narrow", "ident"))
    assert narrow["Q-class"]["answer"] == "lost" and narrow["Q-aug"]["answer"] == "yes"
    assert ident["Q-class"]["answer"] == "equivalent" and ident["Q-aug"]["answer"] == "undecided"
    assert ident["Q-class"]["change"] == 0.0 and ident["Q-class"]["interval"] == "test images only"
    before = taps["backbone"]["metrics"]
    for question, record in narrow.items():
        metric = claims[question]["primary"]
        assert record["n_seeds"] == 3 and record["interval"] in ("hierarchical bootstrap", "t over seeds")
        assert record["change"] == pytest.approx(taps["narrow"]["metrics"][metric] - before[metric])
        per_seed = [taps["narrow"]["seeds"][s]["metrics"][metric] - before[metric] for s in ("0", "1", "2")]
        assert record["per_seed_change"] == pytest.approx(per_seed)
        assert record["ci95"][0] <= record["change"] <= record["ci95"][1]
    assert narrow["Q-class"]["n_units"] == 80 and narrow["Q-class"]["unit"] == "test images"
    assert set(narrow["Q-aug"]["secondary"]) == {"rotation.mlp.acc", "rotation.standardized.acc"}
    assert {"knn.k5.acc", "align", "uniform"} <= set(narrow["Q-class"]["secondary"])
    assert narrow["Q-class"]["line"].startswith("Q-class: narrow head keeps the class information")
    # The older verdicts, kept alongside (demoted in the report): the 2-d head loses every kind of information the
    # probes read (class, label MI, rotation), nothing against; the identity head has every margin 0.
    narrow_verdict, ident_verdict = results["buffer"]["narrow"], results["buffer"]["ident"]
    assert (narrow_verdict["verdict"], narrow_verdict["against"]) == ("buffer", 0)
    assert {m for m, e in narrow_verdict["evidence"].items() if e["resolved"] == "for"} == {
        "linear.acc", "knn.k5.acc", "mi.label", "rotation.acc", "rotation.mlp.acc"}
    assert ident_verdict["verdict"] == "inconclusive" and ident_verdict["support"] == ident_verdict["against"] == 0


def test_a_question_without_its_primary_keeps_its_secondary_measures_and_gives_no_answer():
    taps = _taps({"aug_r2.mean": 0.5, "linear.acc": 0.9},
                 {"h": [{"aug_r2.mean": 0.4 + c, "linear.acc": 0.9} for c in (0.0, 0.01, -0.01)]})
    out = answer_questions(tap_measures(taps), {}, {"h": "h"})["Q-aug"].to_record()
    assert out["not_measured"].startswith("rotation.acc was not measured")
    record = out["heads"]["h"]
    assert record["answer"] == "not measured" and "change" not in record and "p_holm" not in record
    assert record["secondary"]["aug_r2.mean"]["change"] == pytest.approx(-0.1)
    assert record["line"] == "Q-aug: h head: rotation.acc was not measured — not measured"


def test_an_answers_record_has_the_layout_docs_reference_shows():
    """`to_record()` of a real answer (3 seeds, a secondary measure) has the keys, in their order, of
    results.json["claims"] in docs/reference.md's sample: the question's, the head's and a secondary measure's."""
    import json
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "reference.md").read_text()
    block = text[text.index("```json\n") + len("```json\n"):]
    documented = json.loads(block[:block.index("```")])["claims"]["Q-aug"]
    taps = _taps({"rotation.acc": 0.8, "rotation.mlp.acc": 0.7},
                 {"mlp_swish": [{"rotation.acc": 0.8 + c, "rotation.mlp.acc": 0.7 + c} for c in (-0.1, -0.08, -0.12)]})
    answers = answer_questions(tap_measures(taps), {}, {"mlp_swish": "mlp_swish"})["Q-aug"]
    assert answers.heads["mlp_swish"].answer == "yes" and answers.heads["mlp_swish"].n_seeds == 3
    record = answers.to_record()
    assert list(record) == list(documented)
    head, shown = record["heads"]["mlp_swish"], documented["heads"]["mlp_swish"]
    assert list(head) == list(shown)
    assert list(head["secondary"]["rotation.mlp.acc"]) == list(shown["secondary"]["rotation.mlp.acc"])
    assert head == answers.heads["mlp_swish"].to_record() and head["line"].startswith("Q-aug: mlp_swish head")
