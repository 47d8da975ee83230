"""stats.geometry_claims: Q-split and Q-saddle answers from typed values, against their stated rules."""

import pytest

from headprobe.geometry.saddle import SaddleState
from headprobe.registry import QUESTIONS
from headprobe.report.claims import answer_lines
from headprobe.stats.clustered import cluster_bootstrap, proportion_interval
from headprobe.stats.geometry_claims import (
    DIFFERENCE,
    Q_SADDLE,
    Q_SPLIT,
    SplitMeasure,
    answer_saddle,
    answer_split,
)


def test_split_answers_follow_the_interval_and_say_the_prediction():
    measures = [SplitMeasure("relu", {0: [0.0] * 4, 1: [0.0] * 4}, {0: [0.0] * 4, 1: [0.0] * 4}, True, True),
                SplitMeasure("relu_bn", {0: [0.2, 0.3], 1: [0.25, 0.3]}, {0: [0.0, 0.0], 1: [0.0, 0.0]}, False, True),
                SplitMeasure("swish", {0: [0.0, 0.4]}, {0: [0.0, 0.4]}, False, False)]
    claim = answer_split(measures).to_record()
    heads = claim["heads"]
    assert claim["primary"] == Q_SPLIT.primary and claim["margin"] == Q_SPLIT.margin
    assert heads["relu"]["answer"] == "M = 0" and heads["relu"]["ci95"] == [0.0, 0.0]
    assert heads["relu_bn"]["answer"] == "M > 0" and heads["relu_bn"]["value"] == pytest.approx(0.2625)
    assert heads["relu_bn"]["ci95"] == list(cluster_bootstrap([[0.2, 0.3], [0.25, 0.3]]))
    assert heads["relu_bn"]["secondary"]["m_share.running"]["answer"] == "M = 0"
    assert heads["swish"]["answer"] == "undecided"  # one batch at 0: the interval reaches the margin
    assert heads["swish"]["interval"].startswith("evaluation batches only")
    assert heads["relu_bn"]["line"].endswith("— M > 0 (as predicted)")
    assert heads["swish"]["line"].endswith("— undecided (predicted M > 0)")


def state(head: str, seed: int, index: int, negative: bool, collapsed: bool = True) -> SaddleState:
    return SaddleState(head, seed, index, collapsed, 1e-4, 1e-2, -1.0 if negative else 1.0, 2.0, 1e-15, negative,
                       -0.5 if negative else 0.0, True)


def test_saddle_answers_per_head_and_the_difference():
    states = [state(h, s, i, h in ("swish", "gelu") and i != 0) for h in ("linear", "relu", "swish", "gelu")
              for s in range(3) for i in range(20)]
    states.append(state("relu", 0, 99, True, collapsed=False))  # not collapsed: never counted
    target = [state(h, s, i, h == "swish") for h in ("linear", "relu", "swish", "gelu") for s in range(3)
              for i in range(20)]
    claim = answer_saddle({"simsiam": states, "target": target}, "sizes").to_record()
    heads = claim["heads"]
    assert heads["relu"]["n_negative"] == 0 and heads["relu"]["n_collapsed"] == 60 and heads["relu"]["n_states"] == 61
    assert heads["relu"]["answer"] == "not a saddle"
    swish = heads["swish"]
    assert swish["value"] == pytest.approx(57 / 60) and swish["answer"] == "saddle"
    assert swish["ci95"] == proportion_interval([[0.0] + [1.0] * 19] * 3)["ci95"]
    difference = heads[DIFFERENCE]
    assert difference["value"] == pytest.approx(57 / 60) and difference["answer"] == "yes"
    assert difference["secondary"]["negative_share.target"]["value"] == pytest.approx(0.5)
    # 0.5 from 120 smooth-head states against 0 of 120: resolved above the margin 0.25
    assert difference["secondary"]["negative_share.target"]["answer"] == "yes"
    assert heads["gelu"]["secondary"]["negative_share.target"]["answer"] == "not a saddle"
    assert len(claim["states"]["simsiam"]) == len(states) and claim["paper"].startswith("the paper")
    lines = answer_lines({"claims": {"Q-saddle": claim}})
    assert lines[2].startswith("Q-saddle: swish head, simsiam loss: 57/60 collapsed states")
    assert "; swish head, target loss: 60/60" in lines[2]


def test_saddle_answers_each_batchnorm_arm_apart_with_the_head_batchnorms_share():
    import dataclasses

    def armed(h, s, i, arm, negative):
        bn = -0.4 if arm in ("bn_head", "bn_both") else 0.0
        return dataclasses.replace(state(h, s, i, negative), arm=arm, rayleigh_head=-0.5, rayleigh_head_bn=bn,
                                   rayleigh_head_act=-0.5 - bn)

    arms = ("none", "bn_head", "bn_predictor", "bn_both")
    simsiam = [armed(h, s, i, arm, arm != "none" or h == "swish") for h in ("relu", "swish") for arm in arms
               for s in range(3) for i in range(10)]
    target = [armed(h, s, i, arm, arm == "bn_head") for h in ("relu", "swish") for arm in arms[:2]
              for s in range(3) for i in range(10)]
    heads = answer_saddle({"simsiam": simsiam, "target": target}, "sizes").to_record()["heads"]
    assert heads["relu"]["answer"] == "not a saddle" and heads["relu+bn_head"]["answer"] == "saddle"
    assert heads["relu+bn_head"]["arm"] == "bn_head" and heads["relu+bn_head"]["n_collapsed"] == 30
    assert heads["relu+bn_head"]["head_bn_share_of_m_median"] == pytest.approx(0.8)
    assert heads["relu+bn_head"]["head_bn_share_of_lambda_min_median"] == pytest.approx(0.4)
    assert heads["relu"]["head_bn_share_of_m_median"] == 0.0
    # No predictor under the target loss: a predictor arm's secondary is the arm with the same head BatchNorm.
    assert heads["relu+bn_predictor"]["secondary"]["negative_share.target"]["arm"] == "none"
    assert heads["relu+bn_both"]["secondary"]["negative_share.target"]["answer"] == "saddle"
    assert heads[f"{DIFFERENCE}+bn_head"]["answer"] == "no"
    assert heads[DIFFERENCE]["value"] == pytest.approx(1.0)
    assert heads["relu+bn_head"]["line"].startswith("Q-saddle: relu+bn_head head, simsiam loss: 30/30")


def test_the_questions_are_declared_in_the_registry():
    assert QUESTIONS.entry("Q-saddle").help.startswith("claim 4: ") and f"margin {Q_SADDLE.margin:g}" in \
        QUESTIONS.entry("Q-saddle").help
    assert QUESTIONS.get("Q-split") is Q_SPLIT
