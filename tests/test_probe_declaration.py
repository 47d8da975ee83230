"""probes/declaration.py: a probe declares itself in its own module, and every reader reads that declaration.

The test adds a probe the way a built-in one is added: one new module (written to a temporary folder, importable)
holding the function, its options and its `Probe` declaration, plus one registry line (`PROBES.declare`); then it
checks the validator, `headprobe list`, the glossary, the headline plot, the verdict, the scheduler and a tiny run.
"""

import json
import textwrap
from pathlib import Path

import pytest

from headprobe.cli import main
from headprobe.pipeline.probe_sharing import prior_costs, share_of_probes
from headprobe.probes.declaration import (
    CHUNKS,
    CLASS_CHANCE,
    INFORMATION,
    READS,
    WHOLE,
    Metric,
    Probe,
    declared_probe,
    declared_probes,
    fill,
)
from headprobe.recipe import RecipeError, load_recipe
from headprobe.registry import PROBES
from headprobe.report.glossary import describe_metric, is_protocol_value, tooltip
from headprobe.report.plots import headline_metrics
from headprobe.stats.measures import tap_measures
from headprobe.stats.verdict import INFORMATION_CLAIM, buffer_verdict, evidence_rule, predicted_change

MODULE = '''
"""A probe added by a test: test accuracy of the nearest class mean, its centroids shrunk towards 0."""

from dataclasses import dataclass, field

import torch

from headprobe.probes.declaration import CLASS_CHANCE, DESCRIPTION, INFORMATION, Metric, Probe
from headprobe.probes.tap_data import ProbeOutput
from headprobe.registry import within
from headprobe.stats.bootstrap import TEST_IMAGES, PerUnit


@dataclass
class CentroidOptions:
    shrink: float = field(default=0.0, metadata=within(0, 1))


def nearest_centroid(tap, *, shrink: float) -> ProbeOutput:
    means = torch.stack([tap.train_x[tap.train_y == c].mean(0) for c in range(tap.n_classes)]) * (1 - shrink)
    correct = (torch.cdist(tap.test_x.float(), means.float()).argmin(1).cpu() == tap.test_y.cpu()).double()
    return ProbeOutput({"centroid.acc": float(correct.mean()), "centroid.norm": float(means.norm(dim=1).mean())},
                       {"shrink": shrink}, {"centroid.acc": PerUnit(correct, TEST_IMAGES)})


CENTROID = Probe(
    "centroid", nearest_centroid, "nearest class mean (a probe added by a test)", options=CentroidOptions,
    cost=7.5,
    metrics=(
        Metric("centroid.acc", "test accuracy of the nearest class mean", "fraction of test images",
               "higher = more class information", CLASS_CHANCE, role=INFORMATION, predicted=-1, headline=0.5),
        Metric("centroid.norm", "mean norm of the class means", "the tap's units", "a scale", role=DESCRIPTION),
    ),
)
'''


@pytest.fixture
def centroid_probe(tmp_path, monkeypatch):
    """The new probe's module, importable, and its one registry line."""
    folder = tmp_path / "added"
    folder.mkdir()
    (folder / "probe_centroid.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(folder))
    PROBES.declare("centroid", "probe_centroid:CENTROID")
    yield declared_probe("centroid")
    PROBES.remove("centroid")


def test_the_validator_reads_the_new_probes_options_and_ranges(centroid_probe):
    assert load_recipe({"probes": {"centroid": {"shrink": 0.25}}}).probes["centroid"].shrink == 0.25
    assert load_recipe({"probes": ["centroid"]}).probes["centroid"].shrink == 0.0
    with pytest.raises(RecipeError) as err:
        load_recipe({"probes": {"centroid": {"shrink": 2}}})
    assert str(err.value) == "probes.centroid.shrink = 2.0 is out of range; it must be in [0, 1]."
    with pytest.raises(RecipeError, match="shrinkage"):
        load_recipe({"probes": {"centroid": {"shrinkage": 0.1}}})


def test_headprobe_list_shows_the_new_probe(centroid_probe, capsys):
    assert main(["list", "probes"]) == 0
    out = capsys.readouterr().out
    assert "centroid" in out and "nearest class mean (a probe added by a test)" in out


def test_the_glossary_describes_the_new_probes_metrics(centroid_probe):
    info = describe_metric("centroid.acc", n_classes=4)
    assert (info.meaning, info.unit, info.chance) == ("test accuracy of the nearest class mean",
                                                      "fraction of test images", 0.25)
    assert tooltip("centroid.norm") == "centroid.norm: mean norm of the class means; unit: the tap's units; a scale"
    assert not is_protocol_value("centroid.acc")


def test_the_headline_plot_puts_the_new_headline_metric_first(centroid_probe):
    names = ["align", "centroid.norm", "linear.acc", "centroid.acc", "rankme"]
    assert headline_metrics(names) == ["centroid.acc", "linear.acc", "align", "rankme", "centroid.norm"]


def test_the_verdict_counts_the_new_evidence_metric_with_its_declared_direction(centroid_probe):
    assert evidence_rule("centroid.acc") == (-1, INFORMATION_CLAIM)
    assert predicted_change("centroid.norm") is None
    taps = {"backbone": {"metrics": {"centroid.acc": 0.9, "centroid.norm": 2.0}},
            "h": {"metrics": {"centroid.acc": 0.6, "centroid.norm": 1.0}}}
    evidence = buffer_verdict(tap_measures(taps), "h").to_record()["evidence"]
    assert list(evidence) == ["centroid.acc"]
    assert evidence["centroid.acc"]["margin"] == pytest.approx(0.3)  # lower at the head: as the claim predicts
    assert evidence["centroid.acc"]["claim"] == INFORMATION_CLAIM


def test_the_scheduler_shares_out_by_the_declared_cost_prior(centroid_probe):
    assert prior_costs(["knn", "centroid"]) == {"knn": 1.0, "centroid": 7.5}
    # Longest first, each to the least loaded process: the two 7.5 s centroid units go to different processes.
    pending = [["knn", "centroid"], ["knn", "centroid"]]
    shares = [share_of_probes(pending, ["knn", "centroid"], rank, 2, costs=prior_costs(["knn", "centroid"]))
              for rank in (0, 1)]
    assert shares == [{0: ["knn", "centroid"]}, {1: ["knn", "centroid"]}]


@pytest.mark.slow
def test_a_tiny_run_records_the_new_probes_metrics_with_intervals(centroid_probe, tiny_recipe, tmp_path):
    from headprobe import run

    results = run({**tiny_recipe, "probes": {"centroid": {"shrink": 0.1}}}, out=tmp_path / "r", quiet=True)
    tap = results["taps"]["backbone"]
    assert set(tap["metrics"]) == {"centroid.acc", "centroid.norm"}
    low, high = tap["uncertainty"]["centroid.acc"]["ci95"]
    assert 0.0 < low <= tap["metrics"]["centroid.acc"] <= high <= 1.0
    assert tap["protocol"]["centroid"] == {"shrink": 0.1}
    saved = json.loads((Path(tmp_path / "r") / "results.json").read_text())
    assert saved["taps"]["backbone"]["metrics"] == tap["metrics"]


def test_metric_patterns_match_names_and_fill_their_sentences():
    orbit = Metric("[{sweep}.]orbit.spread_rel", "spread[ ({sweep} sweep)]", "ratio", "lower = more invariance")
    assert orbit.match("hue.orbit.spread_rel") == {"sweep": "hue"}
    assert orbit.match("orbit.spread_rel") == {"sweep": None}
    assert orbit.match("a.b.orbit.spread_rel") is None and orbit.match("hue.orbit.spread") is None
    assert orbit.meaning_of({"sweep": "hue"}) == "spread (hue sweep)" and orbit.meaning_of({"sweep": None}) == "spread"
    assert fill("{k}-NN[ at {k}]", {"k": "20"}) == "20-NN at 20"
    assert Metric("x.acc", "m", "u", "d", CLASS_CHANCE).chance_of(0) is None


@pytest.mark.parametrize("bad, words", [
    ({"role": "evidence"}, "has role 'evidence'"),
    ({"role": INFORMATION}, "declares predicted = -1 or \\+1"),
    ({"predicted": -1}, "declares predicted = -1 or \\+1"),
    ({"chance": "1/n"}, "has chance '1/n'"),
    ({"answers": ("Q-other",)}, "bears on \\['Q-other'\\]"),
])
def test_a_metric_declaration_that_contradicts_itself_is_refused(bad, words):
    with pytest.raises(ValueError, match=words):
        Metric("x", "m", "u", "d", **bad)


def test_a_probe_declaration_names_inputs_that_exist_and_a_positive_cost():
    with pytest.raises(ValueError, match="needs \\['depth_maps'\\]"):
        Probe("p", print, "help", needs=("depth_maps",))
    with pytest.raises(ValueError, match="cost 0 must be > 0"):
        Probe("p", print, "help", cost=0)
    with pytest.raises(ValueError, match="options must be a dataclass"):
        Probe("p", print, "help", options=dict)


def test_every_builtin_probe_declares_how_it_reads_its_tap_and_list_shows_it(capsys):
    builtin = [probe for probe in declared_probes() if probe.function.__module__.startswith("headprobe.probes.builtin")]
    assert {probe.name for probe in builtin} >= {"linear", "knn", "spectrum", "invariance", "view_mi", "rotation",
                                                 "augment_r2", "orbits"}
    for probe in builtin:
        assert probe.reads in READS, f"probe {probe.name!r} does not declare reads= (chunks or whole, with why)"
        assert probe.reads == CHUNKS or probe.reads_why, probe.name
    # The streaming ones are those whose chunk tests compare to the whole computation (tests/test_probes_knn.py,
    # test_spectrum_chunks.py, test_view_chunks.py, test_linear_chunks.py).
    assert {p.name for p in builtin if p.reads == CHUNKS} == {"knn", "spectrum", "invariance", "view_mi", "linear"}
    assert main(["list", "probes"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "reads its tap in chunks" in out and "reads its tap whole: the full-batch MLP" in out


def test_reading_a_tap_whole_needs_a_reason():
    with pytest.raises(ValueError, match="reads its tap whole; say why"):
        Probe("p", print, "help", reads=WHOLE)
    with pytest.raises(ValueError, match="choose one of chunks, whole"):
        Probe("p", print, "help", reads="streamed")
    assert Probe("p", print, "help", reads=WHOLE, reads_why="a solver").reading == "reads its tap whole: a solver"
    assert Probe("p", print, "help").reading == "reads its tap: undeclared"  # an old-style plug-in's


def test_a_registry_line_and_its_declaration_must_agree_on_the_name(centroid_probe):
    PROBES.declare("centroids", "probe_centroid:CENTROID")
    try:
        with pytest.raises(ValueError, match="declares itself as 'centroid'"):
            PROBES.entry("centroids")
    finally:
        PROBES.remove("centroids")


def test_a_plugin_registered_the_old_way_reads_as_a_probe_without_metrics():
    PROBES.add("old_style", "headprobe.probes.builtin.knn:measure_knn", "an old-style plug-in", needs=("views",))
    try:
        probe = declared_probe("old_style")
        assert (probe.help, probe.needs, probe.metrics, probe.cost) == ("an old-style plug-in", ("views",), (), 1.0)
    finally:
        PROBES.remove("old_style")


def test_sharding_the_bank_is_declared_with_its_option():
    """The multi-process scheduler runs together the probes that declare `shards_bank` (the k-NN), not a name."""
    assert declared_probe("knn").shards_bank and not declared_probe("linear").shards_bank
    with pytest.raises(ValueError, match="shards its bank, so its options declare `shard_bank`"):
        Probe("sharded", lambda tap: None, "a test's", shards_bank=True)
