"""benchmarks/bench_gpu.py on the CPU (no GPU here): it runs end to end at its tiniest sizes and records every field,
its plain-torch baselines compute what headprobe computes, and it refuses `--device cuda` without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from timeouts import HANG_TIMEOUT_S

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPT = BENCHMARKS / "bench_gpu.py"
DERIVED = {
    "extract_images_per_s", "bare_forward_images_per_s", "extract_ratio", "extract_precision", "extract_loader",
    "extract_max_abs_difference", "head_steps_per_s", "plain_head_steps_per_s", "heads_ratio", "head_steps", "heads",
    "head_names", "knn_queries_per_s", "plain_knn_queries_per_s", "knn_ratio", "knn_prediction_agreement",
    "knn_prefilter", "linear_probe_s", "plain_lbfgs_s", "linear_ratio", "linear_test_accuracy",
    "plain_lbfgs_test_accuracy", "linear_C", "plain_lbfgs_C"}


@pytest.fixture
def bench_gpu(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_gpu

    return bench_gpu


@pytest.mark.slow
def test_bench_gpu_runs_on_the_cpu_and_records_every_field(tmp_path):
    subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--repeats", "1", "--threads", "1",
                    "--out", str(tmp_path)], check=True, capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    result = json.loads((tmp_path / "gpu_script_cpu.quick.json").read_text())
    assert not (tmp_path / "gpu.json").exists()  # that name is kept for numbers measured on a GPU
    assert result["benchmark"] == "gpu_script_cpu" and result["ran_on_gpu"] is False
    assert any("NOT RUN ON A GPU" in note for note in result["notes"])
    assert result["machine"]["device"] == "cpu" and result["sizes"]["scale"] == "tiny"
    assert result["sizes"]["backbone"] == "offline:dinov2-vits14"
    derived = result["derived"]
    assert set(derived) == DERIVED
    for key in ("extract_images_per_s", "bare_forward_images_per_s", "head_steps_per_s", "plain_head_steps_per_s",
                "knn_queries_per_s", "plain_knn_queries_per_s", "linear_probe_s", "plain_lbfgs_s"):
        assert derived[key] > 0, key
    assert derived["extract_precision"] == "fp32"  # bf16 autocast is for GPUs only (features.effective_precision)
    assert derived["extract_max_abs_difference"] < 1e-4  # from the files = the bare forward's features
    assert derived["knn_prediction_agreement"] == 1.0
    assert derived["heads"] == 5 and derived["head_steps"] == 2
    assert len(result["timings"]) == 8 and all(t["median_s"] > 0 for t in result["timings"].values())
    assert [c["met"] in (True, False) for c in result["checks"]] == [True] * 4
    assert [c["benchmark"].split(" ")[0] for c in result["checks"]] == ["extraction", "5-head", "k-NN", "linear"]


def test_bench_gpu_refuses_cuda_without_a_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    run = subprocess.run([sys.executable, str(SCRIPT), "--device", "cuda", "--tiny", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    assert run.returncode == 2 and "--device cpu" in run.stderr and not list(tmp_path.iterdir())


def test_the_plain_knn_baseline_predicts_what_probes_knn_predicts(bench_gpu):
    from headprobe.probes.knn import knn

    g = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 8, generator=g)
    y, yq = torch.randint(4, (500,), generator=g), torch.randint(4, (60,), generator=g)
    x, q = 0.5 * centres[y] + torch.randn(500, 8, generator=g), 0.5 * centres[yq] + torch.randn(60, 8, generator=g)
    ours = knn(x, y, q, yq, ks=(bench_gpu.K,), weighting="uniform", num_classes=4).predictions[bench_gpu.K]
    assert torch.equal(bench_gpu.plain_knn(x, y, q, 4, chunk=16), ours)


def test_the_plain_lbfgs_baseline_fits_the_linear_probe_objective(bench_gpu):
    from headprobe.probes.linear import linear_probe

    g = torch.Generator().manual_seed(1)
    centres = torch.randn(3, 6, generator=g)
    y, yq = torch.randint(3, (300,), generator=g), torch.randint(3, (100,), generator=g)
    x, q = 0.7 * centres[y] + torch.randn(300, 6, generator=g), 0.7 * centres[yq] + torch.randn(100, 6, generator=g)
    grid = (0.01, 0.1, 1.0)
    ours = linear_probe(x, y, q, yq, C_grid=grid, val_fraction=0.2, seed=0, tol=1e-6, whiten=False)
    plain = bench_gpu.plain_lbfgs_probe(x, y, q, yq, grid, tol=1e-6, max_iter=1000, val_fraction=0.2)
    # The same strictly convex objective to the same tolerance: the same C and (but for near-ties) predictions.
    assert plain["C"] == ours.metrics["linear.C"]
    assert plain["acc"] == pytest.approx(ours.metrics["linear.acc"], abs=0.02)
