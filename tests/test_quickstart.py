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
    overrides = ["data.limit.train=200", "data.limit.test=100", "probes.knn.ks=[10,20]", "augment.views=2",
                 "seeds=[0,1]", "train.epochs=3", "train.batch_size=100", "probes.orbits.n_images=8", "report=false"]
    overrides += [f"heads.{i}.width=64" for i in range(3)]
    args = ["run", "recipes/quickstart.yaml", "--out", str(tmp_path / "qs")]
    for item in overrides:
        args += ["--set", item]
    assert main(args) == 0
    results = json.loads((tmp_path / "qs" / "results.json").read_text())
    metrics = results["taps"]["backbone"]["metrics"]
    assert results["backbone"]["id"] == "offline:dinov2-vits14" and results["backbone"]["dim"] == 384
    assert results["backbone"]["params"] == 22_056_192
    assert metrics["linear.acc"] > 0.9, metrics
    assert metrics["knn.k10.acc"] > 0.5, metrics  # chance is 0.1
    assert {"rotation45.orbit.d_ratio", "rotation45.orbit.d_ratio_image"} <= set(metrics)  # class vs image centroids
    assert set(results["taps"]) == {"backbone", "lin@1", "lin", "mlp_relu@1", "mlp_relu", "mlp_swish@1", "mlp_swish"}
    assert {v["verdict"] for v in results["buffer"].values()} <= {"buffer", "no-buffer", "mixed", "inconclusive"}
    low, high = results["taps"]["backbone"]["uncertainty"]["linear.acc"]["ci95"]
    assert low < metrics["linear.acc"] < high and high - low < 0.2  # 100 test images: about ±0.05
    assert all("resolved" in e for v in results["buffer"].values() for e in v["evidence"].values())
    assert set(results["taps"]["lin"]["seeds"]) == {"0", "1"}  # the recipe's seeds, two of them here
    assert results["taps"]["lin"]["uncertainty"]["rankme"]["n_seeds"] == 2
    out = capsys.readouterr().out
    assert "linear.acc" in out and "buffer verdicts" in out
