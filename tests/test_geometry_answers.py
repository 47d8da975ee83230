"""stats/geometry_answers.py and the buffer verdict's typed values: `to_record()` has the layout docs/reference.md
shows (keys in their order, at every level the sample spells out), and that record is what results.json holds once
the record writer has put the typed values."""

import dataclasses
import json
import re
from pathlib import Path

import torch

from headprobe.geometry.saddle import SaddleState
from headprobe.record.directory import RunDir
from headprobe.record.writer import RecordWriter
from headprobe.stats.bootstrap import bootstrap_resamples
from headprobe.stats.geometry_claims import DIFFERENCE, SplitMeasure, answer_saddle, answer_split, with_override
from headprobe.stats.measures import tap_measures
from headprobe.stats.metric_claim import MetricMeasure, answer_metric
from headprobe.stats.verdict import buffer_verdict
from headprobe.stats.whiten_claim import Q_WHITEN, WhitenMeasure, answer_whiten

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "reference.md"
PSD = {"psd": True, "lambda_min": 0.0, "lambda_max": 1.0, "bound": 1e-16}


def _documented() -> tuple[dict, dict]:
    """(the results.json sample, the geometry questions' sample) of docs/reference.md."""
    text = REFERENCE.read_text()
    run = json.loads(re.search(r"`results.json`\n```json\n(.*?)\n```", text, re.S).group(1))
    geometry = json.loads(re.search(r"The geometry questions.*?```json\n(.*?)\n```", text, re.S).group(1))
    return run, geometry


def _state(head: str, seed: int, index: int, negative: bool) -> SaddleState:
    return SaddleState(head, seed, index, True, 1e-4, 1e-2, -1.0 if negative else 1.0, 2.0, 1e-15, negative,
                       -0.5 if negative else 0.0, True)


def _answers() -> dict:
    """Each geometry question answered from small typed measures, as the geometry stage answers it."""
    seeds = range(3)
    init = {s: [0.6 + 0.01 * s + 0.001 * b for b in range(4)] for s in seeds}
    trained = {s: [v - 0.2 - 0.002 * s for v in init[s]] for s in seeds}
    question, (_, override) = with_override(Q_WHITEN, {"Q-whiten": {"margin": 0.1}})
    whiten = answer_whiten([WhitenMeasure("linear", trained, init, [PSD] * 6, (64,), True)], question)
    arch = {"kind": "mlp", "act": "swish", "width": 64, "out_dim": 64, "bn_hidden": False}
    metric = answer_metric([
        MetricMeasure(name, {s: [a + 0.01 * j + 0.01 * s for j in range(4)] for s in seeds},
                      {s: [d + 0.01 * s] * 4 for s in seeds}, {s: [0.0] * 4 for s in seeds},
                      {s: [0.5] * 4 for s in seeds}, arch=arch | {"depth": depth})
        for name, depth, a, d in (("d1", 1, 0.1, 0.4), ("d2", 2, 0.2, 0.3))])
    split = answer_split([SplitMeasure("relu", {s: [0.0] * 8 for s in seeds}, {s: [0.0] * 8 for s in seeds},
                                       True, True)])
    states = [_state(h, s, i, h == "swish" and i != 0) for h in ("relu", "swish") for s in seeds for i in range(20)]
    saddle = answer_saddle({"simsiam": states, "target": states}, "sizes")
    return {"Q-whiten": dataclasses.replace(whiten, override=override),
            "Q-metric": dataclasses.replace(metric, sizes="sizes", time_s=1.0), "Q-split": split,
            "Q-saddle": dataclasses.replace(saddle, time_s=2.0)}


def test_each_geometry_question_s_record_has_the_documented_layout():
    _, documented = _documented()
    answers = _answers()
    assert list(answers) == list(documented)
    for key, shown in documented.items():
        record = answers[key].to_record()
        assert list(record) == list(shown), key
        for head, entry in shown["heads"].items():
            assert list(record["heads"][head]) == list(entry), (key, head)
    heads = {key: answers[key].to_record()["heads"] for key in documented}
    shown_whiten = documented["Q-whiten"]["heads"]["linear"]
    assert list(heads["Q-whiten"]["linear"]["premise"]) == list(shown_whiten["premise"])
    distance = heads["Q-metric"]["d2"]["secondary"]["metric_distance"]
    assert list(distance) == list(documented["Q-metric"]["heads"]["d2"]["secondary"]["metric_distance"])
    running = heads["Q-split"]["relu"]["secondary"]["m_share.running"]
    assert list(running) == list(documented["Q-split"]["heads"]["relu"]["secondary"]["m_share.running"])
    swish = heads["Q-saddle"]["swish"]
    assert list(swish["secondary"]["negative_share.target"]) == [k for k in swish if k != "secondary"]
    assert list(heads["Q-saddle"][DIFFERENCE])[:4] == ["value", "ci95", "newcombe", "bootstrap"]


def test_the_typed_answers_say_what_their_records_say():
    answers = _answers()
    assert answers["Q-whiten"].heads["linear"].answer == "yes" and answers["Q-whiten"].question.margin == 0.1
    assert answers["Q-whiten"].to_record()["override"] == {"margin": 0.1}
    assert answers["Q-metric"].trends == ("depth slope (swish, width 64, out 64)",)
    swish = answers["Q-saddle"].heads["swish"]
    assert swish.answer == "saddle" and swish.counts["n_negative"] == 57 and swish.interval["value"] == 57 / 60
    assert swish.to_record()["line"] == swish.line and "; swish head, target loss" in swish.line
    assert answers["Q-split"].heads["relu"].running.answer == "M = 0"


def _verdict():
    g = torch.Generator().manual_seed(0)
    backbone = (torch.rand(450, generator=g) < 0.9).double()
    head = backbone * (torch.rand(450, generator=g) >= 0.05).double()
    from headprobe.stats.bootstrap import PerUnit

    taps = tap_measures({"backbone": {"metrics": {"linear.acc": float(backbone.mean())}},
                         "relu": {"metrics": {"linear.acc": float(head.mean())}}},
                        {"backbone": {"linear.acc": PerUnit(backbone, "test images")},
                         "relu": {"linear.acc": PerUnit(head, "test images")}})
    return buffer_verdict(taps, "relu", {"test images": bootstrap_resamples(450, n_boot=2000, seed=0)})


def test_the_buffer_verdict_s_record_has_the_documented_layout():
    documented, _ = _documented()
    shown = documented["buffer"]["mlp_swish"]
    verdict = _verdict()
    record = verdict.to_record()
    assert verdict.verdict == "buffer" and verdict.evidence["linear.acc"].resolved == "for"
    assert list(record) == list(shown)
    assert list(record["evidence"]["linear.acc"]) == list(shown["evidence"]["linear.acc"])
    assert list(dataclasses.replace(verdict, tap="relu@1").to_record())[-1] == "tap"


def test_the_writer_puts_each_typed_value_s_record_into_results_json(tmp_path):
    recipe = {"name": "x", "seed": 0}
    record, invocation, _ = RecordWriter.begin(recipe, tmp_path, resume=False, refuse_existing=True)
    writer = RecordWriter(RunDir.create(tmp_path), record, invocation)
    answers, verdict = _answers(), _verdict()
    writer.put("buffer", {"relu": verdict}, merge=True, write=False)
    writer.put("claims", {"Q-aug": {"asks": "recorded first"}})
    writer.put("claims", answers, merge=True)
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["buffer"]["relu"] == json.loads(json.dumps(verdict.to_record()))
    assert list(written["claims"]) == ["Q-aug", *answers]  # the geometry questions after probing's
    for key, answer in answers.items():
        assert written["claims"][key] == json.loads(json.dumps(answer.to_record())), key
