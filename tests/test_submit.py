"""`headprobe submit` (`pipeline.submit`): a recipe as a submitit job, run here with submitit's local executor; a bad
recipe queues nothing; a requeued job resumes the same run directory."""

import json
import shutil

import pytest
import yaml

from headprobe.cli import main
from headprobe.pipeline.submit import RunJob

submitit = pytest.importorskip("submitit")


def _recipe(tmp_path, recipe: dict):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_a_bad_recipe_exits_2_and_submits_nothing(tiny_recipe, tmp_path, capsys):
    path = _recipe(tmp_path, tiny_recipe)
    logs = tmp_path / "logs"
    code = main(["submit", str(path), "--local", "--logs", str(logs), "--set", "backbone.pooling=maen"])
    assert code == 2 and "Did you mean 'mean'" in capsys.readouterr().err
    assert main(["submit", str(path), "--local", "--logs", str(logs), "--cpus", "0"]) == 2
    assert "--cpus = 0 is out of range" in capsys.readouterr().err
    assert not logs.exists()


@pytest.mark.skipif(shutil.which("sbatch") is not None, reason="this machine has SLURM")
def test_without_slurm_it_says_to_use_the_login_node_or_local(tiny_recipe, tmp_path, capsys):
    assert main(["submit", str(_recipe(tmp_path, tiny_recipe)), "--logs", str(tmp_path / "logs")]) == 2
    assert "sbatch is not on PATH" in capsys.readouterr().err and not (tmp_path / "logs").exists()


def test_a_requeued_job_resumes_the_same_run_directory(tmp_path):
    job = RunJob({"name": "x"}, str(tmp_path / "run"))
    again = job.checkpoint()
    assert isinstance(again, submitit.helpers.DelayedSubmission)
    assert again.function == RunJob({"name": "x"}, str(tmp_path / "run"), resume=True)


@pytest.mark.slow
def test_submit_local_runs_the_recipe_as_a_job_and_waits(tiny_recipe, tmp_path, capsys):
    path = _recipe(tmp_path, tiny_recipe)
    out, logs = tmp_path / "run", tmp_path / "logs"
    code = main(["submit", str(path), "--local", "--wait", "--out", str(out), "--logs", str(logs), "--cpus", "1",
                 "--set", "probes.knn.ks=[3]"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "complete" and "knn.k3.acc" in results["taps"]["backbone"]["metrics"]
    assert results["recipe"]["probes"]["knn"]["ks"] == [3]  # the overrides travelled with the job
    assert "submitted job" in printed.out and f"{out / 'results.json'}" in printed.out
    assert list(logs.glob("*_log.out"))  # submitit's own log of the job
