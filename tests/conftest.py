"""Shared fixtures: tiny Hugging Face checkpoints saved to temp dirs, and an isolated feature cache."""

from __future__ import annotations

import os

# Before torch loads MKL: reproducible matrix products, as `import headprobe` sets for the CLI (headprobe/__init__.py).
os.environ.setdefault("MKL_CBWR", "AUTO")

import pytest  # noqa: E402
import torch  # noqa: E402

# pytest-xdist runs one worker per CPU; headprobe's automatic thread count (the job's usable CPUs, never the load)
# would give every worker all of them, oversubscribing the cores. Each worker takes its share instead, unless the
# caller chose a count; tests of the rule itself set or remove the variable themselves.
if (workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))) > 1:
    os.environ.setdefault("HEADPROBE_THREADS", str(max(1, len(os.sched_getaffinity(0)) // workers)))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADPROBE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture
def single_thread():
    """One intra-op thread for the test: its tensors are tiny, and on a shared machine waking threads costs more
    than the math. Modules that want it say `pytestmark = pytest.mark.usefixtures("single_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_dinov2(tmp_path_factory) -> str:
    """A 2-layer, 32-d Dinov2Model with its BitImageProcessor, saved like a hub checkpoint."""
    from transformers import BitImageProcessor, Dinov2Config, Dinov2Model

    path = tmp_path_factory.mktemp("tiny-dinov2")
    torch.manual_seed(0)
    config = Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                          image_size=28, patch_size=14)
    Dinov2Model(config).save_pretrained(path)
    BitImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 28, "width": 28}, do_center_crop=True, resample=3,
        image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225],
    ).save_pretrained(path)
    return str(path)


def tiny_recipe_of(checkpoint: str) -> dict:
    """A recipe that runs in a few seconds: the tiny DINOv2 saved at `checkpoint` on 200/80 digits (for module- or
    session-scoped fixtures, which cannot take the function-scoped `tiny_recipe`)."""
    return {
        "name": "tiny",
        "backbone": {"id": f"hf:{checkpoint}", "pooling": "cls"},
        "data": {"source": "sklearn-digits", "limit": {"train": 200, "test": 80}},
        "features": {"batch_size": 50},
        "probes": {"linear": {"C_grid": [0.01, 0.1, 1.0]}, "knn": {"ks": [5, 20]}},
        "report": False,  # report.html is tested on its own (tests/test_report_*.py) and in test_cli
    }


@pytest.fixture
def tiny_recipe(tiny_dinov2) -> dict:
    """A recipe that runs in a few seconds: tiny DINOv2 on 200/80 digits."""
    return tiny_recipe_of(tiny_dinov2)


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test` runs one worker per CPU), the tests that start torchrun or accelerate or hold a
    fixed port run in one worker, one after another (`--dist loadgroup`): two at once would meet on port 29500."""
    for item in items:
        if item.get_closest_marker("distributed") or item.nodeid.startswith("tests/test_launch_check.py"):
            item.add_marker(pytest.mark.xdist_group("processes"))
