"""Q-whiten through the whole pipeline: withheld, with its reason, where ∇²_h L is not PSD (SimSiam), and answered
where it is (VICReg's invariance term alone)."""

import pytest

from headprobe.pipeline.compose import run
from headprobe.stats.whiten_claim import WITHHELD

pytestmark = pytest.mark.usefixtures("single_thread")


def _recipe(tiny_recipe: dict, objective: dict, predictor: int | None) -> dict:
    return {**tiny_recipe, "probes": {"knn": {"ks": [5]}}, "seeds": [0, 1],
            "heads": [{"name": "lin", "type": "linear", "depth": 1, "width": 8, "predictor": predictor}],
            "objective": objective, "augment": {"preset": "crop-flip", "views": 2},
            "train": {"epochs": 1, "batch_size": 50, "optimizer": "sgd", "lr": 0.01},
            "geometry": {"final": True, "rows": 8, "saddle_states": 0, "metric_batches": 0}}


def test_simsiam_withholds_q_whiten_and_says_the_premise_fails(tiny_recipe, tmp_path):
    results = run(_recipe(tiny_recipe, {"name": "simsiam"}, 8), out=tmp_path / "s", quiet=True)
    record = results["claims"]["Q-whiten"]["heads"]["lin"]
    assert record["premise"]["holds"] is False and record["premise"]["n_indefinite"] > 0
    assert record["premise"]["lambda_min"] < 0
    assert record["answer"] == WITHHELD
    assert f"— {WITHHELD} (premise fails: ∇²_h L is indefinite for this loss" in record["line"]


def test_a_psd_loss_answers_q_whiten(tiny_recipe, tmp_path):
    objective = {"name": "vicreg", "options": {"var_weight": 0.0, "cov_weight": 0.0}}
    results = run(_recipe(tiny_recipe, objective, None), out=tmp_path / "v", quiet=True)
    record = results["claims"]["Q-whiten"]["heads"]["lin"]
    assert record["premise"]["holds"] is True and record["premise"]["n_indefinite"] == 0
    assert record["answer"] in ("yes", "no", "undecided")
    assert record["line"].endswith(f"— {record['answer']}") and record["n_seeds"] == 2
