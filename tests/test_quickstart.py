"""The offline default end to end with the real pretrained weights (on a subset, with small heads, to stay quick)."""

import json

import pytest

from headprobe.cli import main

pytestmark = [pytest.mark.offline_weights, pytest.mark.slow]


def test_quickstart_subset_with_real_weights(tmp_path, capsys):
    pytest.importorskip("onnx")
    from headprobe.backbones.offline import find_onnx

    try:
        find_onnx()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    overrides = ["data.limit.train=200", "data.limit.test=100", "probes.knn.ks=[10,20]", "seeds=[0,1]",
                 "train.epochs=3", "train.batch_size=100", "probes.rotation.mlp_epochs=5", "report=false"]
    overrides += [f"heads.{i}.width=64" for i in range(2)]
    args = ["run", "recipes/quickstart.yaml", "--out", str(tmp_path / "qs")]
    for item in overrides:
        args += ["--set", item]
    assert main(args) == 0
    results = json.loads((tmp_path / "qs" / "results.json").read_text())
    metrics = results["taps"]["backbone"]["metrics"]
    assert results["backbone"]["id"] == "offline:dinov2-vits14" and results["backbone"]["dim"] == 384
    assert results["backbone"]["params"] == 22_056_192
    # 0.85 on these 100 test images with the quickstart's C grid (chance 0.1); with 200 training images whitened
    # at rank N - 1 the validation split cannot rank C (its accuracy stays near chance), so C is a coin toss
    assert metrics["linear.acc"] > 0.8, metrics
    assert metrics["knn.k10.acc"] > 0.5, metrics  # chance is 0.1
    assert metrics["rotation.acc"] > 0.5, metrics  # chance is 0.25
    heads = ("lin_bn", "mlp_relu")
    nulls = tuple(f"{h}.init" for h in heads)
    assert set(results["taps"]) == {"backbone", *(f"{h}{t}" for h in heads + nulls for t in ("@1", ""))}
    low, high = results["taps"]["backbone"]["uncertainty"]["linear.acc"]["ci95"]
    assert low < metrics["linear.acc"] < high and high - low < 0.25  # 100 test images: about ±0.06
    assert set(results["taps"]["lin_bn"]["seeds"]) == {"0", "1"} == set(results["taps"]["lin_bn.init"]["seeds"])
    assert results["heads"]["mlp_relu.init"]["train"]["steps"] == 0
    # With 200 training images the 384-d backbone is whitened at rank N − 1 (fewer images than dimensions,
    # probes/whitening.py); the 64-d heads at full rank.
    assert results["taps"]["backbone"]["protocol"]["linear"]["whiten"]["rank"] == 199
    claims = results["claims"]
    for question in ("Q-aug", "Q-inv", "Q-class"):
        primary = claims[question]["primary"]
        for head in heads:
            record = claims[question]["heads"][head]
            change = results["taps"][head]["metrics"][primary] - metrics[primary]
            assert record["change"] == pytest.approx(change) and record["n_seeds"] == 2, (question, head)
            assert record["ci95"][0] <= record["change"] <= record["ci95"][1], (question, head)
            vs, null = record["vs_null"], results["taps"][f"{head}.init"]["metrics"][primary]
            assert vs["null"] == f"{head}.init" and vs["change"] == pytest.approx(record["head"] - null)
            assert record["decided_on"] == ("head − backbone" if question == "Q-class" else "head − null")
            assert f"against its null {head}.init" in record["line"]
            assert claims[question]["heads"][f"{head}.init"]["is_null"]
    out = capsys.readouterr().out
    assert "linear.acc" in out and "Q-aug" in out
