"""Plug-ins from installed packages (entry points) join the registries, and `headprobe run` finds them by name."""

import json
import os
import shutil
import subprocess
import sys
import warnings
from importlib import metadata
from pathlib import Path

import pytest
import torch
from torch import nn

from headprobe import load_heads, run
from headprobe.plugins import load_plugins
from headprobe.recipe import HeadSpec, RecipeError, load_recipe
from headprobe.registry import HEADS, PROBES, Registry
from headprobe.train.engine import build_head

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "examples" / "plugin"


def _families() -> dict[str, Registry]:
    return {name: Registry(name) for name in ("backbones", "data", "probes", "heads", "objectives")}


def _install(site: Path) -> Path:
    """The example plug-in installed into `site` as pip would: its module and a dist-info with its entry points."""
    import tomllib

    site.mkdir(parents=True, exist_ok=True)
    shutil.copy(PLUGIN / "headprobe_tiny_plugin.py", site)
    project = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]
    info = site / f"headprobe_tiny_plugin-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = []
    for group, entries in project["entry-points"].items():
        lines += [f"[{group}]", *(f"{name} = {value}" for name, value in entries.items()), ""]
    (info / "entry_points.txt").write_text("\n".join(lines))
    return site


def test_entry_points_of_an_installed_package_join_the_registries(tmp_path, monkeypatch):
    site = _install(tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))
    families = _families()
    taken = load_plugins(families)
    assert taken == ["backbones:tinycnn", "objectives:align_uniform", "headprobe_tiny_plugin"]
    entry = families["backbones"].entry("tinycnn")
    assert entry.usage == "tinycnn:<ref>" and entry.help == "plug-in from headprobe-tiny-plugin 0.1.0"
    assert "headprobe_tiny_plugin" not in sys.modules or entry.target  # listed without importing the backbone
    net = families["backbones"].get("tinycnn")("8")
    assert net(torch.zeros(2, 3, 32, 32)).shape == (2, 8)
    terms = families["objectives"].get("align_uniform")(torch.randn(6, 4), torch.randn(6, 4))
    assert set(terms.terms) == {"align_uniform", "align_uniform.align", "align_uniform.uniform"}
    assert "centroid" in families["probes"]  # registered by the package's register function


def test_the_example_plug_in_declares_its_probe_and_metric_as_built_in_probes_do(tmp_path, monkeypatch):
    """The register function declares `centroid` (`Registry.declare`), so its metric is declared: the glossary
    describes it, and the buffer verdict counts it as evidence, read from the plug-in's own declaration."""
    from headprobe.probes.declaration import declared_metrics, declared_probe
    from headprobe.report.glossary import describe_metric
    from headprobe.stats.verdict import evidence_rule

    monkeypatch.syspath_prepend(str(_install(tmp_path / "site")))
    assert "centroid.acc" not in [m.name for m in declared_metrics()]
    load_plugins({**_families(), "probes": PROBES})  # the probe joins headprobe's own registry, as when installed
    try:
        probe = declared_probe("centroid")
        assert (probe.help, [m.name for m in probe.metrics]) == ("nearest class mean (the example plug-in)",
                                                                 ["centroid.acc"])
        assert "centroid.acc" in [m.name for m in declared_metrics()]
        info = describe_metric("centroid.acc", n_classes=4)
        assert (info.meaning, info.unit, info.chance) == (
            "test accuracy of the nearest class mean of the training features", "fraction of test images", 0.25)
        assert evidence_rule("centroid.acc") == evidence_rule("knn.k20.acc")  # evidence, the same way as k-NN's
    finally:
        PROBES.remove("centroid")
    assert "centroid.acc" not in [m.name for m in declared_metrics()]


def test_a_broken_or_clashing_plug_in_is_skipped_with_a_warning():
    def broken(registries):
        raise ImportError("No module named 'torchvisionx'")

    eps = {
        "headprobe.backbones": [metadata.EntryPoint("hf", "elsewhere:load", "headprobe.backbones")],
        "headprobe.plugins": [metadata.EntryPoint("bad", "bad_pkg:register", "headprobe.plugins")],
    }
    families = _families()
    families["backbones"].add("hf", "headprobe.backbones.hf:load_hf", "built in")
    with warnings.catch_warnings(record=True) as caught, pytest.MonkeyPatch.context() as mp:
        warnings.simplefilter("always")
        mp.setattr(metadata.EntryPoint, "load", lambda self: broken)
        taken = load_plugins(families, entry_points=lambda group: eps.get(group, []))
    assert taken == []
    messages = [str(w.message) for w in caught]
    assert any("'hf'" in m and "registered twice" in m and "Rename it" in m for m in messages)
    assert any("'bad_pkg:register'" in m and "torchvisionx" in m and "runs without it" in m for m in messages)
    assert families["backbones"].entry("hf").target == "headprobe.backbones.hf:load_hf"  # the built-in stays


class Gated(nn.Module):
    """A plug-in head type: x -> x * sigmoid(W x) -> V; two taps."""

    def __init__(self, in_dim: int, spec) -> None:
        super().__init__()
        self.gate, self.out = nn.Linear(in_dim, in_dim), nn.Linear(in_dim, spec.width)
        self.depth, self.out_dim = 2, spec.width

    def taps(self, x):
        hidden = x * torch.sigmoid(self.gate(x))
        return [hidden, self.out(hidden)]

    def forward(self, x):
        return self.taps(x)[-1]


def not_a_head(in_dim, spec):
    return nn.Linear(in_dim, spec.width)


@pytest.fixture
def gated_head():
    HEADS.add("gated", f"{__name__}:Gated", "a gated head (a test plug-in)")
    HEADS.add("not_a_head", f"{__name__}:not_a_head", "lacks taps (a test plug-in)")
    yield
    HEADS.remove("gated")
    HEADS.remove("not_a_head")


def test_a_plug_in_head_type_is_built_by_its_factory(gated_head):
    head, _ = build_head(HeadSpec(name="g", type="gated", width=5), 7, seed=0)
    again, _ = build_head(HeadSpec(name="g", type="gated", width=5), 7, seed=0)
    assert isinstance(head, Gated) and [t.shape[1] for t in head.taps(torch.randn(3, 7))] == [7, 5]
    assert torch.equal(head.out.weight, again.out.weight)  # seeded by (seed, name), as the built-in heads
    with pytest.raises(TypeError, match="lacks taps, depth, out_dim; its factory must return"):
        build_head(HeadSpec(name="x", type="not_a_head", width=5), 7, seed=0)


def test_backbone_keyword_takes_a_mapping_as_an_override_and_module_ids_need_python(tiny_recipe, tmp_path):
    with pytest.raises(RecipeError, match="backbone.pooling = 'maen'"):
        run(tiny_recipe, out=tmp_path / "r", backbone={"pooling": "maen"}, quiet=True)
    with pytest.raises(RecipeError, match="passed from Python .* headprobe.backbones"):
        load_recipe({"backbone": {"id": "module:my_pkg.Net"}})


@pytest.mark.slow
def test_run_takes_your_module_and_plug_in_heads(tiny_recipe, tmp_path, gated_head, capsys):
    from headprobe import extract, load_backbone
    from headprobe.backbones.own_module import default_preprocess
    from headprobe.data import load_data

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 6, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    recipe = {**tiny_recipe, "backbone": {"resolution": 28}, "augment": {"preset": "crop-flip", "views": 2},
              "heads": [{"name": "g", "type": "gated", "width": 4}], "train": {"epochs": 1, "batch_size": 64}}
    results = run(recipe, out=tmp_path / "r", backbone=net)
    assert "ImageNet mean and std" in capsys.readouterr().err  # a bare module's contract is said, not silent
    assert results["backbone"]["id"] == "module:torch.nn.modules.container.Sequential"
    assert results["backbone"]["dim"] == 6 and results["recipe"]["backbone"]["id"] == results["backbone"]["id"]
    assert results["backbone"]["preprocess"]["crop"] == 28
    assert set(results["taps"]) == {"backbone", "g@1", "g"}
    # The run's features are exactly those of the stated contract: the same cache entry.
    data = load_data(load_recipe(recipe).data)
    own = load_backbone(module=net, preprocess=default_preprocess(28), dim=6)
    assert extract(own, data.test, data_info=data.info, split="test", batch_size=50).cached
    heads = load_heads(tmp_path / "r")
    assert isinstance(heads["g"], Gated)
    # Resuming the finished run with the same module is recognised as the same recipe.
    assert run(recipe, out=tmp_path / "r", backbone=net, resume=True, quiet=True)["status"] == "complete"


@pytest.mark.slow
def test_headprobe_run_and_list_find_an_installed_plug_in(tmp_path):
    site = _install(tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    listed = subprocess.run([sys.executable, "-m", "headprobe", "list", "backbones"], env=env, capture_output=True,
                            text=True, check=True).stdout
    assert "tinycnn:<ref>" in listed and "plug-in from headprobe-tiny-plugin" in listed
    listed = subprocess.run([sys.executable, "-m", "headprobe", "list", "probes"], env=env, capture_output=True,
                            text=True, check=True).stdout
    assert "nearest class mean (the example plug-in)" in listed  # its declaration's help
    recipe = tmp_path / "plugin.yaml"
    recipe.write_text(json.dumps({
        "name": "plugin", "backbone": {"id": "tinycnn:8", "resolution": 32},
        "data": {"source": "sklearn-digits", "limit": {"train": 120, "test": 60}},
        "heads": [{"name": "mlp", "width": 16}], "objective": {"name": "align_uniform", "options": {"t": 2.0}},
        "augment": {"preset": "crop-flip", "views": 2}, "train": {"epochs": 1, "batch_size": 32},
        "probes": {"centroid": {}, "knn": {"ks": [5]}}, "report": False}))
    done = subprocess.run([sys.executable, "-m", "headprobe", "run", str(recipe), "--out", str(tmp_path / "r")],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    assert results["backbone"]["id"] == "tinycnn:8" and results["backbone"]["dim"] == 8
    assert all("centroid.acc" in results["taps"][t]["metrics"] for t in ("backbone", "mlp@1", "mlp"))
    assert results["protocol"]["train"]["objective_protocol"] == {"t": 2.0}
    records = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert any("align_uniform.uniform" in json.dumps(r) for r in records)
