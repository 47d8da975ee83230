"""The answers open the report and the terminal summary (headprobe/report/claims.py, html.py, table.py); the
per-parameter aug_r2 rows fold under their mean; the training card says how the loss moved or why it cannot."""

import io

from report_run import results_dict
from rich.console import Console

from headprobe.report.claims import answer_lines, answers_section, trained_line
from headprobe.report.html import render_report
from headprobe.report.table import print_summary
from headprobe.stats.answers import claims_record
from headprobe.stats.claims import answer_questions
from headprobe.stats.measures import tap_measures

AUG = {"aug_r2.mean": 0.5, "aug_r2.crop_scale": 0.7, "aug_r2.hue": 0.3}


def _with_claims() -> dict:
    results = results_dict()
    taps = results["taps"]
    taps["backbone"]["metrics"] |= {"rotation.acc": 0.80} | AUG
    seeds = {}
    for i, c in enumerate((-0.10, -0.08, -0.12)):
        metrics = dict(taps["mlp"]["metrics"]) | {"rotation.acc": 0.80 + c, "linear.acc": 0.95 + c / 20}
        seeds[str(i)] = {"metrics": metrics | {k: v + c for k, v in AUG.items()}}
    taps["mlp"]["seeds"] = seeds
    taps["mlp"]["metrics"] = {m: sum(s["metrics"][m] for s in seeds.values()) / 3 for m in seeds["0"]["metrics"]}
    results["claims"] = claims_record(answer_questions(tap_measures(taps), {}, {"mlp": "mlp"}))
    return results


def test_the_answers_open_the_report_with_one_line_per_question_and_head():
    results = _with_claims()
    lines = answer_lines(results)
    assert lines[0].startswith("Q-aug: mlp head discards augmentation information (rotation.acc): −10.0 points [")
    assert lines[0].endswith("3 seeds — yes")  # t over seeds: no per-image values in this record
    text = render_report(results, [])
    # the summary is the first section: the answer lines, then the primary measures with their intervals
    summary = text[text.index("<section id='summary'>"):text.index("<section id='answers'>")]
    assert text.index("<section") == text.index("<section id='summary'>")
    assert lines[0] in summary and "'>buffer</span>" not in summary  # no buffer verdict badges up there
    assert ("<td>mlp</td><td>rotation.acc</td><td class='num'>80.0 / 70.0 (−10.0 [−15.0, −5.0], 3 seeds)</td>"
            "<td><span class='badge buffer'>yes</span></td>") in summary
    assert text.index("<section id='summary'>") < text.index("<h2>Answers to the paper&#39;s questions") < text.index(
        "<h2>Metrics at every tap") < text.index("<h2>Buffer verdicts")


def test_the_per_parameter_aug_r2_rows_fold_under_their_mean():
    results = _with_claims()
    text = render_report(results, [])
    metrics = text[text.index("id='metrics'"):text.index("id='training'")]
    folded = metrics.index("<details><summary>aug_r2 per augmentation parameter (2;")
    assert metrics.index(">aug_r2.mean<") < folded < metrics.index(">aug_r2.crop_scale<")
    assert metrics.index(">aug_r2.hue<") > folded
    answers = answers_section(results, {})
    assert answers.index("aug_r2 per augmentation parameter (2)") < answers.index(">aug_r2.hue<")
    assert answers.index(">aug_r2.mean<") < answers.index("aug_r2 per augmentation parameter")


def test_the_training_card_says_how_the_loss_moved_or_why_it_cannot_tell():
    falling = [{"stage": "train", "step": s, "loss": 10.0 / s} for s in range(1, 41)]
    assert trained_line(falling).startswith("trained: loss fell from")
    three = [{"stage": "train", "step": s, "loss": v, "seed": 2} for s, v in ((2, 5.0), (4, 4.0), (6, 3.5))]
    assert trained_line(three) == ("trained? loss fell from 5.0000 (step 2) to 3.5000 (step 6) (seed 2); only 3 "
                                   "logged steps (at least 6 tell whether it converged; lower train.log_every)")
    assert trained_line([], {"steps": 8, "final_loss": 2.5, "status": "complete"}).startswith(
        "trained? cannot tell: only 0 logged steps")
    assert trained_line([], {"status": "untrained (no parameters)"}) == "not trained: untrained (no parameters)"


def test_the_terminal_summary_opens_with_the_answers():
    results = _with_claims()
    console = Console(file=io.StringIO(), width=200, color_system=None)
    print_summary(results, console=console)
    lines = console.file.getvalue().splitlines()
    assert lines[0].startswith("answers to the paper's questions")
    assert lines[1] == f"  {answer_lines(results)[0]}"
    assert any(line.startswith("buffer verdicts:") for line in lines[4:])  # kept, after the table


def test_a_question_the_run_could_not_answer_is_one_line_and_its_measures_still_show():
    results = results_dict()
    taps = results["taps"]
    taps["backbone"]["metrics"] |= AUG
    taps["mlp"]["metrics"] |= {k: v - 0.1 for k, v in AUG.items()}
    results["claims"] = claims_record(answer_questions(tap_measures(taps), {}, {"mlp": "mlp"}))
    lines = answer_lines(results)
    assert lines[0] == ("Q-aug: not answered — rotation.acc was not measured at the backbone and a head's output; "
                        "add the probe that measures it to the recipe")
    assert sum(line.startswith("Q-aug") for line in lines) == 1
    section = answers_section(results, {})
    assert ">aug_r2.mean<" in section and "aug_r2 per augmentation parameter (2)" in section


def test_an_answer_about_a_head_not_shown_to_have_trained_says_so_first():
    null = {"status": "untrained: good at its initialisation (null)", "steps": 0}
    results = {"heads": {"flat": {"train": {"status": "complete", "steps": 100}},
                         "good": {"train": {"status": "complete", "steps": 100}}, "good.init": {"train": null}},
               "claims": {"Q-inv": {"heads": {h: {"line": f"Q-inv: {h} line"} for h in ("flat", "good", "good.init")}}}}
    flat = [{"step": s, "loss": 6.0 - 0.001 * s} for s in range(10, 101, 10)]  # 1.5% lower, still sloping
    good = [{"step": s, "loss": 1.0 + 6.0 * 0.9 ** s} for s in range(0, 101, 10)]  # 7 → 1, flat at the end
    lines = answer_lines(results, {"flat": flat, "good": good})
    assert lines[0].startswith("[flat: ") and lines[0].endswith("] Q-inv: flat line")
    assert "still falling" in lines[0] and "fell from" in lines[0]
    assert lines[1:] == ["Q-inv: good line", "Q-inv: good.init line"]  # a null head is untrained by design
    assert answer_lines(results) == ["Q-inv: flat line", "Q-inv: good line", "Q-inv: good.init line"]  # no losses


def test_a_checkpoints_own_head_reads_pretrained_not_cannot_tell():
    line = trained_line([], {"steps": 0, "status": "pretrained (not trained)", "final_loss": None})
    assert line.startswith("pretrained: the checkpoint's own head")
