"""The report's Training and Buffer sections (headprobe/report/training.py, verdicts.py): the fields each head type
shows, a run stopped while running, the trained? line next to a verdict; and the metric table's claim-coloured
deltas and "critic uninformative"."""

import pytest
from report_run import results_dict, train_records
from test_report_html import Page

from headprobe.report.html import render_report
from headprobe.report.training import head_fields, last_step, stopped_note

FULL = {"name": "h", "type": "mlp", "depth": 2, "width": 64, "out_dim": None, "act": "swish", "bn_hidden": True,
        "bn_out": False, "l2_out": False, "init_scale": 1.0, "predictor": None, "taps": None}


@pytest.mark.parametrize("config, shown", [
    (FULL, {"type": "mlp", "depth": 2, "width": 64, "act": "swish", "bn_hidden": True, "bn_out": False,
            "l2_out": False, "init_scale": 1.0}),
    (FULL | {"type": "linear"}, {"type": "linear", "depth": 2, "width": 64, "l2_out": False, "init_scale": 1.0}),
    (FULL | {"type": "linear", "depth": 1}, {"type": "linear", "depth": 1, "out_dim": 64, "l2_out": False,
                                             "init_scale": 1.0}),
    (FULL | {"type": "mlp", "depth": 1, "out_dim": 8}, {"type": "mlp", "depth": 1, "out_dim": 8, "bn_out": False,
                                                        "l2_out": False, "init_scale": 1.0}),
    (FULL | {"type": "identity"}, {"type": "identity"}),
])
def test_each_head_type_shows_only_the_fields_that_apply(config, shown):
    assert head_fields(config) == shown


def test_a_pretrained_head_shows_its_checkpoint():
    config = FULL | {"type": "pretrained", "taps": [1, 3]}
    shown = head_fields(config, {"source": "ssl:dino-vits16", "layers": 3})
    assert shown == {"type": "pretrained", "taps": [1, 3], "checkpoint.source": "ssl:dino-vits16",
                     "checkpoint.layers": 3}


def test_stopped_note_names_the_last_logged_step():
    from headprobe.report.plots import train_history

    history = train_history(train_records())
    assert last_step(history) == 40 and last_step({}) is None
    assert stopped_note({"status": "complete"}, history) == ""
    assert stopped_note({"status": "running"}, history).startswith("stopped while running (last step 40)")
    assert "no training step logged" in stopped_note({"status": "running"}, {})


def test_render_report_with_records_puts_a_trained_line_next_to_each_verdict():
    page = render_report(results_dict(), [], train_records())
    assert page.count("trained? ") == 2  # one per buffer card
    assert "trained? converged" in page or "trained? still falling" in page or "trained? barely trained" in page
    assert "Trained? Read from each head&#39;s logged loss" in page  # the rule, stated in the report


def test_deltas_are_coloured_by_their_direction_marked_by_the_claim_and_a_negative_infonce_is_flagged():
    results = results_dict()
    results["taps"]["lin"]["metrics"]["mi.infonce"] = -0.087
    page = Page(render_report(results, []))
    text = render_report(results, [])
    # linear.acc fell at the mlp head: coloured as a fall, marked ✓ as the (older verdict's) claim predicts a fall
    assert "<span class='delta fall' title='the way the buffer claim predicts'>-0.1400 ✓</span>" in text
    # raw align fell at lin (0.40 → 0.33): a description, coloured as a fall, no mark
    assert "<span class='delta fall'>-0.0700</span>" in text
    # the rule is the buffer's: a fall of view_spread_rel is as predicted, a rise of it against
    results["taps"]["backbone"]["metrics"]["view_spread_rel"] = 0.3
    results["taps"]["lin"]["metrics"]["view_spread_rel"] = 0.4
    rose = render_report(results, [])
    assert "<span class='delta rise' title='against the buffer claim&#39;s prediction'>+0.1000 ✗</span>" in rose
    assert page.row("mi.infonce")[4].endswith("critic uninformative")
    assert "<span class='delta fall'>-3.0320</span>" in text  # 0.94·3.1 → −0.087 at lin: no mark
    assert not page.row("mi.infonce")[1].endswith("critic uninformative")
