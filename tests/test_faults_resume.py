"""An interrupted report is resumable (#40): results.json is written "complete" before report.html, so a run stopped
while its report is being made is complete without one; `--resume` then makes the report and changes nothing
else (before, it said "nothing to do")."""

import pytest
import yaml

from headprobe.cli import main

RECIPE = {"name": "tiny", "backbone": {"id": "scratch:vit-tiny", "pooling": "cls"},
          "data": {"source": "sklearn-digits", "limit": {"train": 80, "test": 40}}, "features": {"batch_size": 40},
          "probes": {"knn": {"ks": [5]}}, "report": True}


@pytest.mark.slow
def test_resume_makes_the_report_an_interrupt_left_out(tmp_path, capsys):
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(RECIPE))
    out = tmp_path / "run"
    assert main(["run", str(tmp_path / "recipe.yaml"), "--out", str(out)]) == 0
    (out / "report.html").unlink()  # what an interrupt while the report is written leaves
    results = (out / "results.json").read_bytes()
    capsys.readouterr()
    assert main(["run", str(tmp_path / "recipe.yaml"), "--out", str(out), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"nothing to do: the run in {out} is already complete except its report, made now" in " ".join(err.split())
    assert (out / "report.html").is_file() and (out / "results.json").read_bytes() == results
    assert main(["run", str(tmp_path / "recipe.yaml"), "--out", str(out), "--resume"]) == 0
    assert "except its report" not in capsys.readouterr().err
