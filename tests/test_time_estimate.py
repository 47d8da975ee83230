"""The remaining-time line of `headprobe run` (pipeline/time_estimate.py and RunContext.clock): measured seconds
× the head taps left, printed once after the first tap is probed and once after training."""

import pytest

from headprobe.pipeline.stages import RunContext
from headprobe.pipeline.time_estimate import geometry_estimate, head_tap_count, remaining_estimate, views_estimate
from headprobe.recipe import load_recipe
from headprobe.record.directory import RunDir
from headprobe.record.writer import RecordWriter


def _recipe(**extra):
    heads = [{"name": "mlp", "depth": 3}, {"name": "lin", "type": "linear", "depth": 1},
             {"name": "id", "type": "identity"}, {"name": "two", "depth": 3, "taps": [1, 3]}]
    return load_recipe({"name": "x", "heads": heads, **extra})


def test_head_tap_count_counts_probed_layers_once_per_seed():
    assert head_tap_count(_recipe()) == 3 + 1 + 0 + 2
    assert head_tap_count(_recipe(seeds=[0, 1, 2])) == 3 * 6
    assert head_tap_count(load_recipe({"name": "x"})) == 0


def test_estimate_is_the_measured_seconds_times_the_taps_left():
    line = remaining_estimate(_recipe(), {}, first_probe_s=2.5, head_taps_done=0, after="probing")
    assert line == ("time estimate: ~15 s more: probing 6 head taps (2.5 s per tap, measured on the first tap "
                    "probed), after training the heads (its progress bar times it)")
    line = remaining_estimate(_recipe(geometry={"final": True}), {"train_s": 41.2}, 2.5, 2, "training")
    assert line == ("training took 41 s; time estimate: ~10 s more: probing 4 head taps (2.5 s per tap, measured "
                    "on the first tap probed); plus the final geometry of each head (not estimated)")
    assert remaining_estimate(_recipe(), {}, None, 0, "probing") is None  # nothing measured yet
    assert remaining_estimate(_recipe(), {}, 1.0, 6, "training") is None  # nothing left
    with pytest.raises(ValueError, match="after='extracting' is not a point"):
        remaining_estimate(_recipe(), {}, 1.0, 0, "extracting")


def test_the_views_estimate_is_the_clean_extractions_rate_times_the_view_images():
    line = views_estimate(10.0, 200, 1600)  # 20 images/s; 8 views of 200 images
    assert line.startswith("time estimate: ~80 s for the augmented views next (1,600 view images at 20 images/s")
    assert views_estimate(0.5, 0, 1600) is None  # every clean split came from the cache: nothing timed


def test_geometry_estimate_adds_the_runs_own_seconds_and_the_last_geometry_per_head():
    timing = {"load_s": 3.2, "extract_s": 60.0, "extract_views_s": 200.4, "train_s": 99.0}
    line = geometry_estimate({"timing": timing}, 2, 64)
    assert line == ("geometry estimate: loading and extracting again ≤ ~264 s (what the run took; less from a warm "
                    "feature cache), then 2 heads at 64 rows each (not timed before: each head says its sizes as "
                    "it starts)")
    earlier = {"timing": timing, "geometry_timing": {"geometry_s": 90.0},
               "heads": {"a": {"geometry": {"curvature": {}}}, "b": {"geometry": {"curvature": {}}}, "c": {}}}
    assert geometry_estimate(earlier, 3, 64).endswith(
        "then ~135 s for 3 heads at 64 rows (45 s per head last time, at the rows it used then)")
    assert geometry_estimate({}, 1, 8).startswith("geometry estimate: loading and extracting again (not timed")


def _context(results: dict, show: bool) -> RunContext:
    return RunContext(_recipe(), RecordWriter(RunDir("unused", writable=False), results, None), None, show=show)


def test_run_context_prints_it_after_the_first_probe_and_after_training(capsys):
    results = {"timing": {}, "taps": {"backbone": {"head": None}}}
    ctx = _context(results, show=True)
    ctx.clock("probe_s", 0.0)
    assert capsys.readouterr().err == ""  # a 0 s probe says nothing about the rest
    ctx = _context(results, show=True)
    ctx.clock("probe_s", 3.0)  # 3 s for the backbone tap
    assert capsys.readouterr().err.startswith("time estimate: ~18 s more: probing 6 head taps (3.0 s per tap")
    ctx.clock("probe_s", 1.0)  # a second probe: no second line
    assert capsys.readouterr().err == "" and results["timing"]["probe_s"] == 4.0
    ctx.record.add_time({"train_s": 64.0}, restart=True)
    ctx.announce_estimate("training")
    assert capsys.readouterr().err.startswith("training took 64 s; time estimate: ~18 s more")
    quiet = _context({"timing": {}, "taps": {}}, show=False)
    quiet.record.add_time({"train_s": 1.0}, restart=True)
    quiet.announce_estimate("training")
    assert capsys.readouterr().err == ""  # quiet runs print nothing
