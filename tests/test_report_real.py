"""report.html built from a REAL small run's files (`report_run.real_run`: pipeline.compose.run on a scratch ViT
with curvature tracking), and from the same run as if it had been killed while training."""

import json
import shutil

import pytest
from report_run import real_run
from test_report_html import Page

from headprobe.report.html import write_report

pytestmark = pytest.mark.slow  # a whole run (~10 s on a quiet 2-core machine, a minute under load)


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    root = tmp_path_factory.mktemp("real")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HEADPROBE_CACHE", str(root / "cache"))
        env.setenv("HF_HUB_OFFLINE", "1")
        env.setenv("HF_DATASETS_OFFLINE", "1")
        run_dir, printed = real_run(root / "run")
    report = write_report(run_dir)
    return run_dir, printed, report.read_text()


def test_the_lambda_min_plot_of_a_real_run_is_drawn_from_its_geometry_records(real):
    run_dir, _, text = real
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    tracked = [r for r in records if r["stage"] == "geometry"]
    assert tracked and all("lambda_min" in r for r in tracked)
    assert not any("lambda_min" in r for r in records if r["stage"] == "train")  # the engine keeps them apart
    from headprobe.report.geometry_plots import convergence_flags

    assert None not in convergence_flags(tracked, "lambda_min")  # each point says whether Lanczos converged
    assert (run_dir / "plots" / "lambda_over_training.png").is_file()
    assert "alt='λ_min and λ_max over training'" in text and "could not be drawn" not in text


def test_a_real_report_has_the_glossary_tooltips_and_per_type_head_fields(real):
    run_dir, _, text = real
    page = Page(text)
    results = json.loads((run_dir / "results.json").read_text())
    assert results["heads"]["lin"]["config"]["act"] == "relu"  # recorded, but meaningless for a linear head
    lin, mlp = page.row("lin"), page.row("mlp")
    assert "act" not in lin[1] and "bn_hidden" not in lin[1] and "type: linear" in lin[1]
    assert "out_dim: 16" in lin[1] and "width" not in lin[1]  # one layer: its output width is all there is
    assert "act: relu" in mlp[1] and "width: 16" in mlp[1]
    assert lin[5].split(":")[0] in ("converged", "still falling", "barely trained")  # the trained? column
    # glossary: one row per metric of the run, all known; tooltips on the metric names
    assert "not in the glossary" not in text
    # n_test next to an accuracy in the metric table (the answers above it list knn.k5.acc as a secondary measure)
    assert Page(text[text.index("id='metrics'"):]).row("knn.k5.acc")[0] == "knn.k5.acc n = 60 test images"
    titles = [a.get("title", "") for tag, a in page.tags if tag == "span"]
    assert any(t.startswith("linear.acc: test accuracy of a linear probe") and "; chance 0.1; " in t
               and t.endswith("no invertible linear map of the features changes it beyond rounding") for t in titles)
    # protocol values are not in the metric table
    metric_rows = text.split("<table class='metrics'>", 1)[1].split("</table>", 1)[0]
    assert "linear.C" not in metric_rows and "linear.val_acc" not in metric_rows and "ceiling" not in metric_rows
    assert "<h3>Protocol values</h3>" in text and page.row("linear.C")


def test_a_real_run_prints_a_time_estimate_after_its_first_timed_stage(real):
    _, printed, _ = real
    lines = [line for line in printed.splitlines() if "time estimate:" in line]
    assert len(lines) == 3
    # before the views (a cold cache here): what the clean extraction measured, times the view images
    assert lines[0].startswith("time estimate: ~") and "s for the augmented views next" in lines[0]
    assert lines[1].startswith("time estimate: ~") and "probing 3 head taps" in lines[1]
    assert "after training the heads" in lines[1]
    assert lines[2].startswith("training took ")


def test_a_killed_run_says_where_it_stopped_and_shows_what_exists(real, tmp_path):
    run_dir, _, _ = real
    killed = tmp_path / "killed"
    shutil.copytree(run_dir, killed, ignore=shutil.ignore_patterns("plots", "report.html"))
    results = json.loads((killed / "results.json").read_text())
    # killed while training: results.json was last written after the backbone's probes
    results.update(status="running", heads={}, buffer={},
                   taps={"backbone": results["taps"]["backbone"]})
    (killed / "results.json").write_text(json.dumps(results))
    records = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    last = max(r["step"] for r in records if r["stage"] == "train")
    text = write_report(killed).read_text()
    assert "trained no head" not in text
    assert f"stopped while running (last step {last})" in text
    assert "<span class='badge running'>running</span>" in text
    assert "No buffer verdict yet: stopped while running" in text
    page = Page(text)
    assert page.row("mlp")[2] == "stopped while running" and page.row("lin")[3] == str(last)
    assert "alt='Loss and collapse curves'" in text and "alt='λ_min and λ_max over training'" in text
