"""stats.whiten_claim: Q-whiten's answers from typed values, against its stated rules."""

import pytest

from headprobe.registry import QUESTIONS
from headprobe.stats.claims import check_claims_section
from headprobe.stats.geometry_claims import with_override
from headprobe.stats.whiten_claim import Q_WHITEN, WhitenMeasure, answer_whiten

PSD = {"psd": True, "lambda_min": 0.0, "lambda_max": 1.0, "bound": 1e-16}
INDEFINITE = {"psd": False, "lambda_min": -0.2, "lambda_max": 1.0, "bound": 1e-16}


def _measure(drop: float, premise=PSD) -> WhitenMeasure:
    init = {s: [0.6 + 0.01 * s + 0.001 * b for b in range(4)] for s in range(3)}
    trained = {s: [v - drop - 0.002 * s for v in init[s]] for s in range(3)}
    return WhitenMeasure("lin", trained, init, [premise] * 6, (64,), True)


@pytest.mark.parametrize(("drop", "answer"), [(0.2, "yes"), (0.0, "no"), (0.05, "undecided")])
def test_the_answer_follows_the_interval_against_the_margin(drop, answer):
    record = answer_whiten([_measure(drop)]).to_record()["heads"]["lin"]
    assert record["answer"] == answer and record["n_seeds"] == 3 and record["n_units"] == 4
    assert record["line"].startswith("Q-whiten: lin head isotropy error") and record["line"].endswith(answer)


def test_an_indefinite_loss_hessian_withholds_the_answer():
    record = answer_whiten([_measure(0.2, INDEFINITE)]).to_record()["heads"]["lin"]
    assert record["answer"] == "withheld" and "premise fails: ∇²_h L is indefinite" in record["line"]


def test_the_margin_is_declared_once_and_overridable():
    assert QUESTIONS.get("Q-whiten") is Q_WHITEN and QUESTIONS.entry("Q-whiten").help.startswith("claim 1: ")
    check_claims_section({"Q-whiten": {"margin": 0.3}})
    with pytest.raises(ValueError, match="cannot be set"):
        check_claims_section({"Q-whiten": {"primary": "x"}})
    question, recorded = with_override(Q_WHITEN, {"Q-whiten": {"margin": 0.3}})
    assert question.margin == 0.3 and recorded == ("Q-whiten", {"margin": 0.3})
    assert answer_whiten([_measure(0.2)], question).heads["lin"].answer == "no"
