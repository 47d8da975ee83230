"""The input pipeline's options: the worker count chosen from the machine, and what a run records about it."""

import pytest
import torch

from headprobe.data import loader
from headprobe.data.loader import auto_workers, loader_options, pipeline_record, resolve_workers
from headprobe.recipe import RecipeError, load_recipe


@pytest.mark.parametrize(("cpus", "local", "device", "expected"), [
    (1, 1, "cuda", 0), (2, 1, "cuda", 1), (4, 1, "cuda", 3), (16, 1, "cuda", 8), (64, 1, "cuda", 8), (16, 4, "cuda", 3),
    (8, 8, "cuda", 0), (2, 1, "cpu", 0), (4, 1, "cpu", 1), (16, 1, "cpu", 4), (64, 1, "cpu", 8), (16, 4, "cpu", 1)])
def test_auto_workers_per_device_and_local_process(cpus, local, device, expected):
    assert auto_workers(cpus, local, device) == expected


def test_auto_workers_reads_the_affinity_mask_and_the_launchers_local_world_size(monkeypatch):
    monkeypatch.setattr(loader, "cpus_available", lambda: 12)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert auto_workers(device="cuda") == resolve_workers(None, "cuda") == 8
    assert auto_workers() == resolve_workers(None) == 3  # the CPU: a quarter of the CPUs
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert auto_workers(device="cuda") == 3
    assert resolve_workers(5) == 5 and resolve_workers(0, "cuda") == 0
    with pytest.raises(ValueError, match=r"features.num_workers = -1: give a worker count >= 0, or null"):
        resolve_workers(-1)


def test_loader_options_pin_and_prefetch_on_cuda_only_with_workers():
    assert loader_options(0, "cpu") == {"num_workers": 0, "pin_memory": False}
    assert loader_options(2, "cuda", persistent=True) == {"num_workers": 2, "pin_memory": True, "prefetch_factor": 4,
                                                          "persistent_workers": True}
    assert loader_options(0, torch.device("cuda")) == {"num_workers": 0, "pin_memory": True}


def test_the_record_names_the_rule_and_the_chosen_count(monkeypatch):
    monkeypatch.setattr(loader, "cpus_available", lambda: 6)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    gpu, cpu = pipeline_record(None, "cuda"), pipeline_record(None, "cpu")
    assert gpu["num_workers"] == 5 and gpu["num_workers_rule"] == ("auto: min(8, CPUs - 1) per local process, with 6 "
                                                                   "CPUs available")
    assert cpu["num_workers"] == 1 and cpu["num_workers_rule"].startswith("auto: min(8, CPUs // 4) per local process")
    assert cpu["prefetch_factor"] == 4 and not cpu["pin_memory"] and gpu["pin_memory"]
    assert pipeline_record(2, "cuda") == {"num_workers": 2, "num_workers_rule": "requested", "pin_memory": True,
                                          "prefetch_factor": 4}


def test_the_recipe_default_is_auto_and_a_negative_count_is_refused():
    assert load_recipe({}).features.num_workers is None and load_recipe({}).features.memory_map is True
    assert load_recipe({"features": {"num_workers": 3}}).features.num_workers == 3
    with pytest.raises(RecipeError, match=r"features.num_workers = -1 is out of range; it must be >= 0"):
        load_recipe({"features": {"num_workers": -1}})


@pytest.mark.slow
def test_a_run_records_the_chosen_worker_count(tiny_recipe, tmp_path):
    from headprobe import run

    recipe = {**tiny_recipe, "probes": {"linear": {"C_grid": [1.0]}}}
    results = run(recipe, out=tmp_path / "r", quiet=True).data
    features = results["protocol"]["features"]
    assert features["input_pipeline"] == pipeline_record(None, "cpu" if not torch.cuda.is_available() else "cuda")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert features["input_pipeline"]["num_workers"] == auto_workers(device=device) and features["memory_map"] is True
