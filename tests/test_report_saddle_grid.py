"""stats.saddle_grid: claim 4's per-cell counts from a constructed results dict (exact counts), the tally of
tracked points with its escape scale, the start chosen per head (geometry.collapse_heads), and where it is shown."""

import pytest

from headprobe.recipe import RecipeError, load_recipe
from headprobe.stats.saddle_grid import grid_lines, grid_text, head_kind, recorded_grid, saddle_grid, tally_points


def _tally(tracked, collapsed, saddle_collapsed, saddle, drive=None):
    return {"tracked": tracked, "collapsed": collapsed, "saddle_collapsed": saddle_collapsed, "saddle": saddle,
            "unknown": 0, "escape_drive_sum": drive, "escape_step": None}


def _results():
    heads = {
        "swish_c": {"config": {"type": "mlp", "act": "swish", "bn_hidden": False},
                    "tracked": {"0": _tally(10, 8, 7, 9, 1e-4), "1": _tally(10, 10, 10, 10, 3e-4),
                                "2": _tally(10, 6, 5, 6, 2e-4)}},
        "swish_n": {"config": {"type": "mlp", "act": "swish", "bn_hidden": False},
                    "tracked": {"0": _tally(10, 0, 0, 4), "1": _tally(10, 0, 0, 3), "2": _tally(10, 0, 0, 5)}},
        "relu_c": {"config": {"type": "mlp", "act": "relu", "bn_hidden": False},
                   "tracked": {"0": _tally(10, 10, 0, 0), "1": _tally(10, 9, 1, 1), "2": _tally(10, 10, 0, 0)}},
        "gelu_bn_c": {"config": {"type": "mlp", "act": "gelu", "bn_hidden": True},
                      "tracked": {"0": _tally(10, 10, 10, 10)}},
        "lin": {"config": {"type": "linear"}},  # not tracked: no row
    }
    start = {name: {"requested": name.endswith("_c")} for name in heads}
    return {"heads": heads, "protocol": {"train": {"collapse_start": start}}}


def test_the_grid_counts_each_cell_over_its_seeds_exactly():
    rows = {(r["kind"], r["start"]): r for r in saddle_grid(_results())}
    assert list(rows) == [("swish", "collapsed"), ("swish", "normal"), ("relu", "collapsed"), ("gelu+bn", "collapsed")]
    swish = rows["swish", "collapsed"]
    assert (swish["tracked"], swish["collapsed"], swish["saddle_collapsed"], swish["saddle"]) == (30, 24, 22, 25)
    assert swish["n_seeds"] == 3 and swish["heads"] == ["swish_c"] and swish["paper"] == "72/100"
    assert swish["saddle_collapsed_share"]["value"] == pytest.approx(22 / 30)
    low, high = swish["saddle_collapsed_share"]["ci95"]
    assert low < 22 / 30 < high and swish["saddle_collapsed_share"]["n_clusters"] == 3
    assert swish["escape_drive_max"] == 3e-4
    normal = rows["swish", "normal"]
    assert (normal["collapsed"], normal["saddle_collapsed"], normal["saddle"]) == (0, 0, 12)
    assert normal["paper"] == "69/100" and normal["collapsed_share"]["ci95"][0] == 0.0
    relu = rows["relu", "collapsed"]
    assert (relu["collapsed"], relu["saddle_collapsed"], relu["paper"]) == (29, 1, "1/100")
    assert relu["saddle_collapsed_share"]["ci95"][1] < swish["saddle_collapsed_share"]["ci95"][0]
    assert rows["gelu+bn", "collapsed"]["paper"] == "" and rows["gelu+bn", "collapsed"]["n_seeds"] == 1


def test_the_table_and_the_claims_section_show_the_recorded_grid():
    results = _results()
    assert recorded_grid(results) == [] and grid_text({"r": results}) == ""
    results["saddle_grid"] = saddle_grid(results)
    lines = grid_lines(recorded_grid(results))
    assert len(lines) == 2 + 4 and "| swish | collapsed | 3 | 24/30 | 22/30 = 0.73 [" in lines[2]
    assert lines[2].endswith("| 22/24 | 0.0003 | 72/100 |")
    assert "run r:" in grid_text({"r": results}) and lines[4].startswith("| relu | collapsed | 3 | 29/30 | 1/30")


def test_a_tally_counts_collapsed_saddles_apart_and_records_the_escape_scale():
    points = [{"stage": "geometry", "step": s, "collapsed": c, "negative_beyond_bound": n, "lambda_min": lam,
               "lambda_max": 2.0} for s, c, n, lam in ((10, True, True, -0.5), (20, True, False, 0.1),
                                                     (30, False, True, -0.2), (40, False, False, 0.3))]
    train = [{"stage": "train", "step": 40, "lr": 0.01}]
    tally = tally_points(points + train, lr=0.05, frozen=False)
    assert (tally["tracked"], tally["collapsed"], tally["saddle_collapsed"], tally["saddle"]) == (4, 2, 1, 2)
    assert tally["escape_drive_sum"] == pytest.approx(0.05 * 0.5 * 10)  # lr before the first train record: 0.05
    assert tally["escape_step"] == 30 and tally["curvature_explains_escape"] == "partly"  # 0.25: between 0.1 and 1
    assert tally_points(points, lr=0.05, frozen=True)["curvature_explains_escape"].startswith("no (frozen")


def test_head_kinds_label_batchnorm():
    assert [head_kind(c) for c in ({"type": "linear"}, {"type": "mlp", "act": "gelu", "bn_hidden": True},
                                   {"type": "mlp", "act": "relu", "bn_hidden": False})] == ["linear", "gelu+bn", "relu"]


def test_collapse_heads_must_name_heads_of_the_recipe():
    recipe = load_recipe({"heads": [{"name": "a"}, {"name": "b"}],
                          "geometry": {"collapse_offset": 1.0, "collapse_heads": ["a"]}})
    assert recipe.geometry.collapse_heads == ["a"]
    with pytest.raises(RecipeError, match=r"geometry.collapse_heads names 'c', not a head of this recipe; heads: a, b"):
        load_recipe({"heads": [{"name": "a"}, {"name": "b"}], "geometry": {"collapse_heads": ["c"]}})


def test_runs_of_a_sweep_pool_into_one_grid():
    def one(seed_tally, start):
        return {"name": "g", "heads": {"head": {"config": {"type": "mlp", "act": "swish", "bn_hidden": False},
                                                "tracked": {"0": seed_tally}}},
                "protocol": {"train": {"collapse_start": {"head": {"requested": start}}}}}

    runs = [one(_tally(10, 9, 8, 9), True), one(_tally(10, 5, 5, 6), True), one(_tally(10, 0, 0, 7), False)]
    rows = {(r["kind"], r["start"]): r for r in saddle_grid(runs)}
    pooled = rows["swish", "collapsed"]
    assert (pooled["n_seeds"], pooled["tracked"], pooled["collapsed"], pooled["saddle_collapsed"]) == (2, 20, 14, 13)
    assert rows["swish", "normal"]["saddle"] == 7
    for run in runs:
        run["saddle_grid"] = saddle_grid(run)
    text = grid_text({f"r{i}": r for i, r in enumerate(runs)})
    assert text.count("run r") == 3 and "pooled over the 3 runs" in text and "| swish | collapsed | 2 | 14/20 |" in text


def test_runs_at_several_learning_rates_get_a_cell_per_rate():
    """The paper's activation × BN × lr grid: a sweep over train.lr pools each kind per rate, never across rates;
    runs at one rate keep the plain kind."""
    def one(act, bn, lr, tally):
        return {"name": "g", "recipe": {"train": {"lr": lr}},
                "heads": {"head": {"config": {"type": "mlp", "act": act, "bn_hidden": bn}, "tracked": {"0": tally}}},
                "protocol": {"train": {"collapse_start": {"head": {"requested": True}}}}}

    runs = [one("swish", False, 0.005, _tally(10, 9, 8, 9)), one("swish", False, 0.5, _tally(10, 2, 1, 3)),
            one("relu", True, 0.005, _tally(10, 10, 0, 10)), one("swish", False, 0.005, _tally(10, 7, 7, 7))]
    rows = {(r["kind"], r["start"]): r for r in saddle_grid(runs)}
    assert set(rows) == {("swish, lr 0.005", "collapsed"), ("swish, lr 0.5", "collapsed"),
                         ("relu+bn, lr 0.005", "collapsed")}
    low = rows["swish, lr 0.005", "collapsed"]
    assert (low["n_seeds"], low["tracked"], low["collapsed"], low["saddle_collapsed"]) == (2, 20, 16, 15)
    assert low["paper"] == "72/100" and rows["relu+bn, lr 0.005", "collapsed"]["paper"] == ""
    same = [one("swish", False, 0.05, _tally(10, 9, 8, 9)), one("swish", False, 0.05, _tally(10, 2, 1, 3))]
    assert [r["kind"] for r in saddle_grid(same)] == ["swish"]
