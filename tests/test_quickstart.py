"""The offline default end to end with the real pretrained weights (on a subset, to stay quick)."""

import json

import pytest

from headprobe.cli import main

pytestmark = pytest.mark.offline_weights


def test_quickstart_subset_with_real_weights(tmp_path, capsys):
    pytest.importorskip("onnx")
    from headprobe.backbones.offline import find_onnx

    try:
        find_onnx()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    overrides = ["data.limit.train=300", "data.limit.test=150", "probes.knn.ks=[10,20]"]
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
    assert "linear.acc" in capsys.readouterr().out
