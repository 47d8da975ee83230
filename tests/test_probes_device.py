"""Probes on the run's device (#16): every registered probe keeps to the device of its TapData.

Without a GPU, `fake_accelerator` (tests/fake_accelerator.py) stands in for one: tensors moved to it report another
device and CUDA's device rules are enforced, so a probe that builds a CPU tensor next to device tensors, hands a
device tensor to NumPy / scikit-learn, trains a module left on the CPU or draws on the device from a CPU generator
fails here as it would on a GPU. Its values live in CPU memory, so the numbers must equal the CPU run's. The
`cuda`-marked test compares each probe on a real GPU with the CPU, within the tolerances stated there; it is
skipped where `torch.cuda.is_available()` is False and has not yet run on a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fake_accelerator import ACCELERATOR, DeviceMixError, OnAccelerator, fake_accelerator

from headprobe.data.augment import PARAM_NAMES
from headprobe.probes.tap_data import TapData
from headprobe.registry import PROBES

pytestmark = pytest.mark.usefixtures("single_thread")

# Options that keep each probe small here; a probe missing from this table runs with its defaults.
SMALL = {"linear": {"C_grid": [0.1, 1.0]}, "rotation": {"C_grid": [0.1, 1.0], "mlp_epochs": 5},
         "view_mi": {"batch_size": 32}, "knn": {"ks": [5, 20]}}


def make_tap(n: int = 120, m: int = 60, d: int = 16, classes: int = 3, separation: float = 3.0,
             seed: int = 0) -> TapData:
    """A tap with every input a probe can ask for: class clusters, noisy views with random augmentation
    parameters, rotated copies (a shift per rotation) and a rotation45 orbit per test image."""
    g = torch.Generator().manual_seed(seed)
    centres = separation * torch.randn(classes, d, generator=g)
    train_y, test_y = torch.arange(n) % classes, torch.arange(m) % classes
    train_x = centres[train_y] + torch.randn(n, d, generator=g)
    test_x = centres[test_y] + torch.randn(m, d, generator=g)
    n_views = (2 * n) // 3
    views = train_x[:n_views, None] + 0.5 * torch.randn(n_views, 3, d, generator=g)
    params = torch.rand(n_views, 3, len(PARAM_NAMES), generator=g)
    shift = torch.randn(d, generator=g)

    def rotated(x):
        return torch.cat([x + r * shift for r in range(4)]), torch.arange(4).repeat_interleave(len(x))

    (rot_train_x, rot_train_y), (rot_test_x, rot_test_y) = rotated(train_x[: n // 3]), rotated(test_x[: m // 3])
    orbits = {"rotation45": test_x[:12, None] + 0.3 * torch.randn(12, 10, d, generator=g)}
    return TapData("backbone", train_x, train_y, test_x, test_y, classes, views=views, view_params=params,
                   rotated_train_x=rot_train_x, rotated_train_y=rot_train_y, rotated_test_x=rot_test_x,
                   rotated_test_y=rot_test_y, orbits=orbits, orbit_labels=test_y[:12])


def tensors_in(value):
    """Every tensor inside nested dicts, lists, tuples and dataclasses."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors_in(v)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from tensors_in(getattr(value, f.name))


# The stand-in must refuse what CUDA refuses, or the probe test below could not fail.
def test_the_fake_accelerator_refuses_a_cpu_tensor_next_to_device_tensors():
    with fake_accelerator():
        x = torch.randn(5, 3).to(ACCELERATOR)
        assert x.device == ACCELERATOR and isinstance(x, OnAccelerator)
        assert float((x + torch.zeros(3, device=x.device)).sum()) == pytest.approx(float(x.cpu().sum()))
        assert float(x.sum() + torch.tensor(1.0)) == pytest.approx(float(x.cpu().sum()) + 1)  # CPU scalars are fine
        with pytest.raises(DeviceMixError, match="CPU tensor of shape"):
            x + torch.zeros(3)
        with pytest.raises(DeviceMixError, match="CPU tensor"):
            torch.nn.Linear(3, 2)(x)  # a module left on the CPU


def test_the_fake_accelerator_refuses_numpy_and_cpu_generators_but_allows_cpu_indices():
    with fake_accelerator():
        x = torch.randn(6, 2).to(ACCELERATOR)
        with pytest.raises(TypeError, match="Tensor.cpu"):
            x.numpy()
        with pytest.raises(TypeError, match="Tensor.cpu"):
            np.asarray(x)
        with pytest.raises(DeviceMixError, match="generator"):
            torch.randperm(6, generator=torch.Generator().manual_seed(0), device=x.device)
        order = torch.randperm(6, generator=torch.Generator().manual_seed(0))
        assert torch.equal(x[order].cpu(), x.cpu()[order])
        assert torch.equal(x[:, [1, 0]].cpu(), x.cpu()[:, [1, 0]])
        assert x.cpu().numpy().shape == (6, 2) and x.tolist() == x.cpu().tolist()


def test_the_fake_accelerator_trains_a_module_moved_to_it_like_the_cpu():
    def train(device):
        torch.manual_seed(0)
        net = torch.nn.Linear(3, 2).to(device)
        opt = torch.optim.Adam(net.parameters(), lr=0.1)
        x = torch.arange(12.0).reshape(4, 3).to(device)
        for _ in range(3):
            opt.zero_grad()
            net(x).square().mean().backward()
            opt.step()
        return net.weight.detach().cpu()

    reference = train("cpu")
    with fake_accelerator():
        assert torch.allclose(train(ACCELERATOR), reference, rtol=1e-6, atol=1e-7)


def test_tapdata_to_moves_every_tensor_and_leaves_the_original():
    tap = make_tap()
    with fake_accelerator():
        moved = tap.to(ACCELERATOR)
    fields = {f.name for f in dataclasses.fields(TapData)}
    for name in fields:
        before, after = getattr(tap, name), getattr(moved, name)
        if isinstance(before, torch.Tensor):
            assert after.device == ACCELERATOR and before.device.type == "cpu", name
            assert torch.equal(after.inner, before), name
        elif name == "orbits":
            assert {s: t.device for s, t in after.items()} == {"rotation45": ACCELERATOR}
        else:
            assert after == before, name
    assert {"train_x", "views", "view_params", "rotated_test_y", "orbit_labels"} <= {
        name for name in fields if isinstance(getattr(tap, name), torch.Tensor)}


@pytest.mark.parametrize("name", PROBES.names())
def test_every_registered_probe_runs_on_the_device_and_matches_the_cpu(name):
    tap, probe, options = make_tap(), PROBES.get(name), SMALL.get(name, {})
    reference = probe(tap, **options)
    with fake_accelerator():
        out = probe(tap.to(ACCELERATOR), **options)
    assert out.metrics and set(out.metrics) == set(reference.metrics)
    for metric, value in out.metrics.items():
        assert isinstance(value, float), metric
        assert value == pytest.approx(reference.metrics[metric], rel=1e-9, abs=1e-12), metric
    # Per-unit values are saved (safetensors), gathered across processes and bootstrapped against CPU resamples.
    for metric, unit in out.per_unit.items():
        assert isinstance(unit.unit, str), metric  # PerUnit, SpreadRatio, ...: what headprobe.stats.bootstrap resamples
        for t in tensors_in(unit):
            assert type(t) is torch.Tensor and t.device.type == "cpu", metric
        for mine, theirs in zip(tensors_in(unit), tensors_in(reference.per_unit[metric]), strict=True):
            assert torch.allclose(mine.double(), theirs.double(), rtol=1e-9, atol=1e-12), metric
    assert not list(tensors_in(out.protocol)), "the protocol goes into results.json: plain numbers only"


def _knn_prefiltered(x, y, q, yq):
    from headprobe.probes.knn import knn

    out = knn(x, y, q, yq, ks=(5,), prefilter=True)  # the certified bfloat16 search (on by default on GPUs)
    return out.metrics | {"prefilter_queries": float(out.protocol["prefilter"]["queries"])}


def _linear_binary_float64(x, y, q, yq):
    from headprobe.probes.linear import linear_probe

    return linear_probe(x.double(), y % 2, q.double(), yq % 2, C_grid=[1.0]).metrics  # K = 2: one weight vector


def _separable_critic_mi(x, y, q, yq):
    from headprobe.probes.information import mutual_information

    out = mutual_information(x[:, :4], x[:, 4:8] + x[:, :4], method="infonce", critic="separable", batch_size=16,
                             steps=20)
    return {"mi": out["mi"]}


# Code paths the registered probes do not take with their defaults (or that the pretend device turns off).
@pytest.mark.parametrize("path", [_knn_prefiltered, _linear_binary_float64, _separable_critic_mi],
                         ids=lambda f: f.__name__.strip("_"))
def test_other_probe_paths_run_on_the_device_and_match_the_cpu(path):
    g = torch.Generator().manual_seed(2)
    x, q = torch.randn(2500, 8, generator=g), torch.randn(100, 8, generator=g)
    y, yq = (x[:, 0] > 0).long() + (x[:, 1] > 0).long(), (q[:, 0] > 0).long() + (q[:, 1] > 0).long()
    reference = path(x, y, q, yq)
    with fake_accelerator():
        out = path(*(t.to(ACCELERATOR) for t in (x, y, q, yq)))
    assert out.keys() == reference.keys()
    for metric, value in out.items():
        assert value == pytest.approx(reference[metric], rel=1e-9, abs=1e-12), metric


SEEN: dict = {}


@dataclasses.dataclass
class NoOptions:
    """device_spy's options: none."""


def device_spy(data: TapData):
    """A probe that records where its inputs are (registered for one test)."""
    SEEN.update({f.name: getattr(data, f.name).device for f in dataclasses.fields(data)
                 if isinstance(getattr(data, f.name), torch.Tensor)})
    SEEN["train_x"], SEEN["values"] = data.train_x.device, data.train_x.cpu()
    return SimpleNamespace(metrics={}, protocol={}, per_unit={})


def test_probe_tap_hands_the_probes_their_tap_on_the_process_device(tmp_path):
    """probing.probe_tap builds the TapData (the tap's transform applied) and moves it to ctx.state.device."""
    from headprobe.pipeline.executors import LocalProbes
    from headprobe.pipeline.probing import probe_tap
    from headprobe.pipeline.stages import FeatureSet
    from headprobe.pipeline.taps import Tap
    from headprobe.record.directory import RunDir
    from headprobe.record.writer import RecordWriter
    from headprobe.report.progress import stage_progress

    tap = make_tap()
    features = FeatureSet(SimpleNamespace(features=tap.train_x, labels=tap.train_y),
                          SimpleNamespace(features=tap.test_x, labels=tap.test_y), tap.n_classes)
    ctx = SimpleNamespace(
        recipe=SimpleNamespace(probes={"device_spy": NoOptions()}, seed=0,
                               data=SimpleNamespace(val_fraction=0.2)),
        state=SimpleNamespace(device=ACCELERATOR), resamples={}, probes=LocalProbes(),
        record=RecordWriter(RunDir(tmp_path, writable=False), {"taps": {}, "timing": {}}, None),
        stage=lambda _: contextlib.nullcontext(), verify_cache=lambda final=False: None,
        progress=lambda: stage_progress(False))
    SEEN.clear()
    PROBES.add("device_spy", f"{__name__}:device_spy", "records where its inputs are")
    try:
        with fake_accelerator():
            probe_tap(ctx, features, Tap("head", "head", 1, lambda x: 2 * x))
    finally:
        PROBES.remove("device_spy")
    assert torch.equal(SEEN.pop("values"), 2 * tap.train_x)  # the tap's transform, then the move
    assert set(SEEN) >= {"train_x", "train_y", "test_x", "test_y"} and set(SEEN.values()) == {ACCELERATOR}


# On a GPU: float64 probes agree to 1e-6 relative (only the reduction order differs). Probes whose decisions come
# from float32 products (k-NN neighbours, the logistic fit, the rotation MLP) may flip near-tied units: accuracies
# may differ by 3 units (of the 300 test images, 400 rotated test rows, 120 validation rows), the label-MI bound by
# 0.05 nats, and the validation-chosen C only where the CPU's validation accuracies at the two Cs are that close.
CUDA_TAP = {"n": 600, "m": 300, "d": 32, "classes": 4, "separation": 0.3}  # about 80% accuracy: room to differ
FLIPS = 3


def _close_on_gpu(metric: str, cuda: float, cpu: float, protocol: dict) -> bool:
    linear = protocol.get("linear", protocol)  # the rotation probe nests its linear probe's protocol
    if metric.endswith("val_acc"):
        return abs(cuda - cpu) <= FLIPS / linear["n_val"] + 1e-12
    if metric.endswith("acc"):
        return abs(cuda - cpu) <= FLIPS / CUDA_TAP["m"] + 1e-12
    if metric == "linear.C":
        accuracy = dict(zip(linear["C_grid"], linear["val_accuracy"], strict=True))
        return cuda == cpu or abs(accuracy[cuda] - accuracy[cpu]) <= FLIPS / linear["n_val"] + 1e-12
    if metric == "mi.label":
        return abs(cuda - cpu) <= 0.05
    return math.isclose(cuda, cpu, rel_tol=1e-6, abs_tol=1e-9)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", PROBES.names())
def test_every_registered_probe_on_cuda_matches_the_cpu(name):
    tap, probe, options = make_tap(**CUDA_TAP), PROBES.get(name), SMALL.get(name, {})
    reference = probe(tap, **options)
    out = probe(tap.to("cuda"), **options)
    assert set(out.metrics) == set(reference.metrics)
    far = {m: (v, reference.metrics[m]) for m, v in out.metrics.items()
           if not _close_on_gpu(m, v, reference.metrics[m], reference.protocol)}
    assert not far, f"CUDA vs CPU beyond the stated tolerances: {far}"
    for metric, unit in out.per_unit.items():
        assert all(t.device.type == "cpu" for t in tensors_in(unit)), metric


def test_a_head_tap_runs_the_head_on_the_device(tmp_path):
    """taps.tap_data with a device hands out rows on it: the backbone features move there a block at a time as they
    are read, so a trained head's layers run there (the head follows its input); the values equal the head applied
    on the CPU."""
    from headprobe.features.rows import materialise
    from headprobe.pipeline.stages import FeatureSet
    from headprobe.pipeline.taps import head_taps, tap_data
    from headprobe.train.heads import ProjectionHead

    tap = make_tap()
    torch.manual_seed(0)
    head = ProjectionHead(tap.train_x.shape[1], depth=2, width=8, out_dim=4, act="relu")
    features = FeatureSet(SimpleNamespace(features=tap.train_x, labels=tap.train_y),
                          SimpleNamespace(features=tap.test_x, labels=tap.test_y), tap.n_classes)
    recipe = SimpleNamespace(seed=0, data=SimpleNamespace(val_fraction=0.2))
    expected = head_taps("h", head)[0].transform(tap.train_x)
    with fake_accelerator():
        data = tap_data(features, head_taps("h", head)[0], recipe, ACCELERATOR)
        assert data.train_x.device == ACCELERATOR
        rows = data.train_x[10:50]
        assert rows.device == ACCELERATOR and next(head.parameters()).device == ACCELERATOR
        values = materialise(data.train_x).cpu()
        assert torch.equal(rows.cpu(), values[10:50])
    assert torch.allclose(values, expected, atol=1e-6)
